"""``writable_twin``: building a frozen, slotted dataclass on a hot path without its ``__init__``.

A frozen dataclass's ``__init__`` stores each field with ``object.__setattr__(self, name, value)``
(its own ``__setattr__`` refuses): a global lookup, an attribute lookup and a call per field, 1.3 us
for five fields on the development machine against 0.3 us for a mutable dataclass. The simulator
builds a ``RequestView`` and a ``RouteDecision`` per request (and a ``NodeLoad`` or ``LinkState``
when a policy asks for one): about 7% of a prefix-cached simulation went to those stores.

A *writable twin* is a plain class with the frozen class's ``__slots__``, hence the same memory
layout. A fast constructor (one per class, next to it: ``core.views.new_request_view``, ...)
fills a twin with ordinary attribute stores and then sets its ``__class__`` to the frozen class:
CPython allows ``__class__`` assignment between heap classes of identical layout (and checks
that they are). The object is then the one the class's ``__init__`` would have built, 0.4 us for
five fields. Only classes without ``__post_init__`` and with no base but ``object`` qualify
(``writable_twin`` checks); ``tests/unit/test_core.py`` checks each fast constructor against the
class's own. Pure.
"""

from __future__ import annotations

import dataclasses


def writable_twin(cls: type) -> type:
    """A class with ``cls``'s slots and no frozen ``__setattr__`` (see the module docstring)."""
    params = getattr(cls, "__dataclass_params__", None)
    slots = cls.__dict__.get("__slots__")
    if params is None or not params.frozen or slots is None:
        raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass")
    if cls.__bases__ != (object,) or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: only a class on object without __post_init__")
    names = tuple(f.name for f in dataclasses.fields(cls))
    if tuple(slots) != names:
        raise TypeError(f"{cls.__name__}: slots {slots} are not its fields {names}")
    return type(f"_Writable{cls.__name__}", (), {"__slots__": tuple(slots)})

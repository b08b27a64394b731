"""Identifiers shared by every layer.

They are plain strings at run time (cheap to hash, to log and to put on the wire); ``NewType`` lets
mypy keep a node id from being passed where a site id is expected. Imports nothing.
"""

from typing import NewType

RequestId = NewType("RequestId", str)
NodeId = NewType("NodeId", str)
SiteId = NewType("SiteId", str)
LinkId = NewType("LinkId", str)


def link_id_for(src_site: SiteId, dst_site: SiteId) -> LinkId:
    """The canonical id of the directed link from ``src_site`` to ``dst_site``."""
    return LinkId(f"{src_site}->{dst_site}")

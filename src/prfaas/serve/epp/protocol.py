"""The Endpoint Picker Protocol's wire side, over Envoy ``ext_proc`` v3 messages (no I/O).

- The picked endpoints, in fallback order, go out as ``x-gateway-destination-endpoint:
  ip:port[,ip:port...]`` (a request header Envoy's ``override_host`` load-balancing policy reads)
  and the same value in dynamic metadata ``envoy.lb`` / ``x-gateway-destination-endpoint``.
- A subset hint comes in as filter metadata ``envoy.lb.subset_hint`` /
  ``x-gateway-destination-endpoint-subset``: a list of ``ip:port`` (or one comma-separated
  string); endpoints outside it are never picked.
- No ready endpoint: an immediate 503; shedding: an immediate 429; a bad request body: the
  gateway's own 4xx; each with an OpenAI-style error body."""

from __future__ import annotations

import json
from collections.abc import Iterable

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

DESTINATION_HEADER = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"


def subset_hint(request: ep.ProcessingRequest) -> frozenset[str] | None:
    """The endpoints the proxy allows (None: no hint)."""
    md = request.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in md:
        return None
    fields = md[SUBSET_NAMESPACE].fields
    if SUBSET_KEY not in fields:
        return None
    value = fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        items = [v.string_value for v in value.list_value.values]
    elif kind == "string_value":
        items = value.string_value.split(",")
    else:
        return frozenset()
    return frozenset(i.strip() for i in items if i.strip())


def header_map(headers: base_pb2.HeaderMap) -> dict[str, str]:
    """Request headers by lower-case name (Envoy sends values as raw bytes or as strings)."""
    out: dict[str, str] = {}
    for h in headers.headers:
        out[h.key.lower()] = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return out


def _set_headers(pairs: Iterable[tuple[str, str]]) -> ep.CommonResponse:
    mutation = ep.HeaderMutation(
        set_headers=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=k, raw_value=v.encode()),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
            for k, v in pairs
        ]
    )
    return ep.CommonResponse(header_mutation=mutation, clear_route_cache=False)


def continue_headers() -> ep.ProcessingResponse:
    """Headers seen: go on (the decision waits for the body)."""
    return ep.ProcessingResponse(request_headers=ep.HeadersResponse())


def route(endpoints: tuple[str, ...], extra: Iterable[tuple[str, str]]) -> ep.ProcessingResponse:
    """The body's answer: the destination header (and metadata) plus ``extra`` headers."""
    value = ",".join(endpoints)
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION_HEADER: value}})
    common = _set_headers([(DESTINATION_HEADER, value), *extra])
    return ep.ProcessingResponse(
        request_body=ep.BodyResponse(response=common), dynamic_metadata=metadata
    )


def route_headers_only(
    endpoints: tuple[str, ...], extra: Iterable[tuple[str, str]]
) -> ep.ProcessingResponse:
    """A request without a body (GET): the destination set in the headers' answer."""
    value = ",".join(endpoints)
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION_HEADER: value}})
    common = _set_headers([(DESTINATION_HEADER, value), *extra])
    return ep.ProcessingResponse(
        request_headers=ep.HeadersResponse(response=common), dynamic_metadata=metadata
    )


def immediate(
    status: int, message: str, error_type: str, code: str | None, retry_after_s: int | None = None
) -> ep.ProcessingResponse:
    """Answer the client directly (the request goes nowhere)."""
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    headers = [("content-type", "application/json")]
    if retry_after_s is not None:
        headers.append(("retry-after", str(retry_after_s)))
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),  # type: ignore[arg-type]
            headers=_set_headers(headers).header_mutation,
            body=json.dumps(body).encode(),
            details=f"prfaas_epp_{status}",
        )
    )

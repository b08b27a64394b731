"""Where ``prfaas up``'s node processes listen (``serve.launch_child.node_host``)."""

from __future__ import annotations

import pytest

from prfaas.serve.launch_child import node_host

pytestmark = pytest.mark.timeout(30)


def test_nodes_listen_where_the_gateway_does_when_it_names_an_address() -> None:
    assert node_host("10.77.3.2") == "10.77.3.2"  # a pool elsewhere reaches the receivers
    assert node_host("127.0.0.1") is None and node_host("::1") is None  # the default
    assert node_host("0.0.0.0") is None and node_host("::") is None  # not an address to give
    assert node_host("localhost") is None

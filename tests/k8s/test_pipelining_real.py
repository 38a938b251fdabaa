"""Bindings over pipelined connections (`k8s.pipelining`) against a real kube-apiserver.

The pool writes requests back to back on a few keep-alive connections and reads the answers
in order; these tests prove the real server answers that way: every pod bound once, where it
was sent, over no more connections than asked, with its 409s and 404s as the library's path
gives them.
"""

from __future__ import annotations

import anyio
import pytest
from kubekit import Kube
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s.applying import _ASSIGNED
from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.errors import Conflict, NotFound


async def test_pods_bound_at_once_over_four_connections_land_each_on_its_node(api: ApiClient, kube: Kube) -> None:
    """40 bindings sent at once over 4 pipelined connections bind every pod to the node it was sent to."""
    nodes = [await kube.node("n1", gpus=64), await kube.node("n2", gpus=64)]
    names = [f"p{i}" for i in range(40)]
    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(kube.pod, name)
    client = KubeClient(api, bind_connections=4)
    try:
        async with anyio.create_task_group() as tg:
            for i, name in enumerate(names):
                tg.start_soon(client.bind, kube.ns, name, nodes[i % 2])
        assert client._binds is not None and client._binds.opened <= 4
    finally:
        await client.aclose()
    assert [await kube.pod_node(name) for name in names] == [nodes[i % 2] for i in range(len(names))]


async def test_a_pod_bound_elsewhere_is_a_409_naming_its_node_and_the_connection_serves_on(
    api: ApiClient, kube: Kube
) -> None:
    """Binding a bound pod again answers 409 naming its node, a missing pod 404, and the next binding on
    the same connection still succeeds (an error answer leaves the pipeline in step)."""
    n1, n2 = await kube.node("n1"), await kube.node("n2")
    for name in ("a", "b"):
        await kube.pod(name)
    client = KubeClient(api, bind_connections=1)
    try:
        await client.bind(kube.ns, "a", n1)
        with pytest.raises(Conflict) as conflict:
            await client.bind(kube.ns, "a", n2)
        assert _ASSIGNED.search(conflict.value.message).group(1) == n1  # type: ignore[union-attr]
        with pytest.raises(NotFound):
            await client.bind(kube.ns, "nobody", n1)
        await client.bind(kube.ns, "b", n2)
        assert client._binds is not None and client._binds.opened == 1
    finally:
        await client.aclose()
    assert (await kube.pod_node("a"), await kube.pod_node("b")) == (n1, n2)

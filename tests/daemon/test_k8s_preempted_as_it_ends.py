"""A gang preempted as its run ends: the eviction takes pods that succeeded, and their owner makes none again.

The demo showed it (`muster demo --duration 120`: 2 to 8 gangs a run ended `JobFailed` "pods gone before
binding"): the core preempts a gang whose last pods are finishing, the kubelet marks them Succeeded
before the eviction deletes them, and the controller, which counts them done, makes no replacement. The
gang waited for replacements, so its re-admission found no pods. The run is over: the job finishes.
"""

from __future__ import annotations

import anyio
from adapterkit import eventually
from emulatorkit import admission, pod_object, submit_gang
from kubernetes_asyncio.client import CoreV1Api

from muster.events.types import JobFailed, JobFinished, JobPreempted, JobStarted


async def test_a_gang_whose_pods_succeed_while_it_is_preempted_finishes_and_its_readmission_binds_nothing(
    kube, start_adapter
):
    """Pods that succeed before their eviction takes them end the job JobFinished; its re-admission is skipped."""
    emulator, api = kube
    core = CoreV1Api(api)
    async with start_adapter(api, pod_wait_seconds=2) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events, size=2, grace_seconds=0)
        admitted = admission(sub, ["n1", "n2"])
        assert (await adapter.apply(admitted)).outcome == "applied"
        first, last = (sub.pods[name].split("/")[1] for name in sorted(sub.pods))
        for name in (first, last):  # the kubelet starts both
            await core.patch_namespaced_pod_status(name, "ns", {"status": {"phase": "Running"}})
        await events.wait_for(lambda e: len(e.of(JobStarted)) == 1)
        await core.patch_namespaced_pod_status(first, "ns", {"status": {"phase": "Succeeded"}})
        await adapter.caught_up("pods", emulator.resource_version)

        # the eviction of the last pod reaches the server only after that pod succeeded
        held = emulator.fail("POST", "pods", "eviction", name=last, status=None, delay=1.0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(adapter.apply, JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue"))
            await eventually(lambda: held.times == 0)
            await core.patch_namespaced_pod_status(last, "ns", {"status": {"phase": "Succeeded"}})
        await eventually(lambda: pod_object(emulator, f"ns/{last}") is None)
        # the Job is complete: its controller makes no replacement

        await events.wait_for(lambda e: len(e.of(JobFinished)) == 1)
        again = await adapter.apply(admitted)  # the core re-admitted it in the same second
        assert again.outcome == "skipped"
        assert events.of(JobFailed) == []

"""Leader election on a Kubernetes Lease, against the API server double (kmock's KubernetesEmulator).

The double answers Leases as kube-apiserver does where election depends on it
(every write a new resourceVersion, a replace with a stale one refused with
409, create of an existing name 409, replace of a missing one 404), so no
lease-specific emulation is needed. Electors run in the test's event loop,
the same as the double's server: a test can write the Lease between a
candidate's read and its replace. TTLs are short, waits are deadlines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import loopkit
import yaml
from electionkit import running
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s.lease import LeaseElector
from muster.daemon.loop import LoopOptions, SchedulerLoop
from muster.demo.emulator import KubeEmulator
from muster.demo.simcluster import SimulatedCluster, block_rack_nodes
from muster.events.store import EventStore, StoredEvent
from muster.events.types import (
    DECISION_TYPES,
    JobAdmitted,
    JobId,
    JobSubmitted,
    LeaderElected,
    PodSet,
    QueueConfigured,
    QueueName,
    SchedulerConfigured,
)

NS, NAME = "muster-system", "muster-leader"
LEASES = "coordination.k8s.io/v1/leases"
TTL = 2.0
DEADLINE = 30.0  # generous: waits end as soon as their condition holds; CI shares 2 cores with the suite


def lease_of(emu: KubeEmulator) -> dict[str, Any]:
    obj = emu.get_object(LEASES, NS, NAME)
    assert obj is not None
    return obj


def holder_of(emu: KubeEmulator) -> str | None:
    obj = emu.get_object(LEASES, NS, NAME)
    return None if obj is None else obj["spec"].get("holderIdentity")


def calls(emu: KubeEmulator, method: str) -> int:
    """Requests with this HTTP method the double has received so far."""
    return sum(1 for r in emu if str(r.method.value).upper() == method)


async def until(predicate: Callable[[], bool], seconds: float = DEADLINE, every: float = 0.01) -> None:
    with anyio.fail_after(seconds):
        while True:
            if predicate():
                return
            await anyio.sleep(every)


def elector(api: ApiClient, holder: str, ttl: float = TTL, **kw: Any) -> LeaseElector:
    return LeaseElector(api, NS, NAME, holder, ttl, **kw)


# ---------------------------------------------------------------- the elector alone


async def test_exactly_one_of_two_candidates_leads(kube):
    """Two candidates started together: one creates the Lease and leads, the other stays a standby throughout."""
    emu, api = kube
    a, b = elector(api, "a"), elector(api, "b")
    both: list[float] = []

    def check() -> bool:
        if a.leading() and b.leading():
            both.append(anyio.current_time())
        return False

    async with running(a), running(b):
        await until(lambda: a.leading() or b.leading())
        leader, standby = (a, b) if a.leading() else (b, a)
        rv = int(lease_of(emu)["metadata"]["resourceVersion"])
        with anyio.move_on_after(TTL * 2):  # several renewals and standby polls
            await until(check, seconds=DEADLINE)
        await until(lambda: int(lease_of(emu)["metadata"]["resourceVersion"]) >= rv + 3)
        assert leader.leading() and not standby.leading()

    assert both == []
    assert (leader.terms, standby.terms) == (1, 0)
    assert holder_of(emu) == leader.holder
    assert lease_of(emu)["spec"]["leaseTransitions"] == 0


async def test_the_leader_renews_and_keeps_the_lease(kube):
    """The holder renews every ttl/5 (renewTime and resourceVersion advance) and keeps its one term."""
    emu, api = kube
    a, b = elector(api, "a", ttl=4.0), elector(api, "b", ttl=4.0)
    async with running(a):
        await until(a.leading)
        first = lease_of(emu)
        async with running(b):
            # six renewals span more than a whole lease duration: the standby would have taken a stale Lease
            await until(
                lambda: (
                    int(lease_of(emu)["metadata"]["resourceVersion"]) >= int(first["metadata"]["resourceVersion"]) + 6
                )
            )
            assert a.leading() and not b.leading()
    now = lease_of(emu)["spec"]
    assert now["holderIdentity"] == "a" and now["leaseTransitions"] == 0
    assert now["acquireTime"] == first["spec"]["acquireTime"]
    assert now["renewTime"] > first["spec"]["renewTime"]
    assert now["leaseDurationSeconds"] == 4
    assert (a.terms, b.terms) == (1, 0)


async def test_a_leader_that_stops_renewing_is_replaced_after_the_ttl_and_stops_believing_first(kube):
    """A holder that stops renewing gives way after the TTL; its own belief ended before the new holder's write."""
    emu, api = kube
    a = elector(api, "a")
    b = elector(api, "b")
    seen: list[tuple[bool, float]] = []
    b.on_change = lambda: seen.append((a.leading(), anyio.current_time()))
    async with running(a) as a_scope:
        await until(a.leading)
        async with running(b):
            await until(lambda: int(lease_of(emu)["metadata"]["resourceVersion"]) >= 4)  # b polled, a renewed
            a_scope.cancel()  # a stops renewing, as a crashed or cut-off replica does; the Lease stays
            await until(b.leading)
            assert not a.leading()

    assert seen and seen[0][0] is False  # when b learnt it won, a no longer believed it led
    assert a.valid_until <= b.acquired_at  # a's belief ended before b even sent its takeover
    assert b.acquired_at - a.valid_until >= TTL * (1 - 0.75) - 0.05  # b waited a full duration after a's last write
    spec = lease_of(emu)["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert (a.terms, b.terms) == (1, 1)


async def test_a_standby_takes_a_lapsed_lease_when_it_lapses_not_at_its_next_poll(kube):
    """The standby's takeover is sent when the holder's last renewal (as it saw it) lapses, within 0.15 s."""
    emu, api = kube
    a, b = elector(api, "a"), elector(api, "b")
    assert b.poll_every >= 0.5  # a takeover on the next poll would come up to this late
    lapses: list[float] = []
    async with running(a) as a_scope:
        await until(a.leading)
        async with running(b):
            await until(lambda: int(lease_of(emu)["metadata"]["resourceVersion"]) >= 4)
            a_scope.cancel()  # a crashes: its Lease stays as last renewed

            def won() -> bool:
                if not b.leading() and b.lapses_at is not None:
                    lapses.append(b.lapses_at)  # when the Lease as b last saw it lapses
                return b.leading()

            await until(won, every=0.005)
    assert lapses and 0 <= b.acquired_at - lapses[-1] <= 0.15
    assert a.valid_until <= b.acquired_at


async def test_resign_hands_the_lease_over_at_once(kube):
    """A resigning holder writes the Lease back without a holder; a standby takes it long before the TTL."""
    emu, api = kube
    ttl = 60.0  # a takeover within the test's deadline can only come from the release, never from expiry
    a, b = elector(api, "a", ttl=ttl), elector(api, "b", ttl=ttl)
    async with running(a):
        await until(a.leading)
        async with running(b):
            await until(lambda: calls(emu, "GET") > 0)  # b has read the Lease: a standby
            await a.resign()
            assert not a.leading()
            assert holder_of(emu) in (None, "b")
            await until(b.leading, seconds=20)
            assert not a.leading()
    assert holder_of(emu) == "b"
    assert (a.terms, b.terms) == (1, 1)  # the resigner stood aside and did not take it back


async def test_a_holder_whose_lease_was_written_by_another_loses_it_at_its_next_renewal(kube):
    """Another writer's change fails the holder's renewal with 409: it stops leading at once, overwriting nothing."""
    emu, api = kube
    a = elector(api, "a", ttl=10.0)  # renewals every 2 s, validity 7.5 s: losing it early can only come from the 409
    lost: list[tuple[float, dict[str, Any]]] = []
    async with running(a):
        await until(a.leading)
        a.on_change = lambda: lost.append((anyio.current_time(), lease_of(emu)))
        taken = emu.patch_object(LEASES, NS, NAME, {"spec": {"holderIdentity": "c"}})
        valid_until = a.valid_until
        await until(lambda: bool(lost))
    assert lost[0][0] < valid_until
    assert lost[0][1] == taken  # a's renewal changed nothing
    assert not a.leading() and a.terms == 1


async def test_resign_never_releases_a_lease_someone_else_holds(kube):
    """A deposed holder's resign finds another holder's resourceVersion and leaves the Lease alone."""
    emu, api = kube
    a = elector(api, "a")
    async with running(a) as scope:
        await until(a.leading)
        scope.cancel()
    # someone else took it meanwhile (a's view of the Lease is now stale)
    emu.patch_object(LEASES, NS, NAME, {"spec": {"holderIdentity": "c"}})
    await a.resign()
    assert holder_of(emu) == "c"
    assert not a.leading()


async def test_a_replace_with_a_stale_resource_version_loses_instead_of_overwriting(kube):
    """A candidate whose takeover races another write gets 409 and stays a standby; the other write stands."""
    emu, api = kube
    emu.put_object(
        LEASES,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 1, "leaseTransitions": 3},
        },
    )
    # the takeover (after the ghost's duration) is held up in the server, between b's read and its write
    fault = emu.fail("PUT", "leases", name=NAME, status=None, delay=1.0)
    b = elector(api, "b", ttl=1.0, request_seconds=10.0)
    async with running(b):
        await until(lambda: fault.times == 0)  # b's replace is in the server, waiting
        emu.patch_object(LEASES, NS, NAME, {"spec": {"renewTime": "2026-12-02T00:00:00.000000Z"}})  # ghost renews
        reads = calls(emu, "GET")
        await until(lambda: calls(emu, "GET") > reads)  # b's replace was answered and b campaigns again
        assert b.terms == 0 and not b.leading()
        assert holder_of(emu) == "ghost" and lease_of(emu)["spec"]["leaseTransitions"] == 3
        # the ghost renews no more: b takes it once it has seen no change for the ghost's duration
        await until(b.leading)
    assert lease_of(emu)["spec"]["leaseTransitions"] == 4


async def test_api_errors_and_timeouts_do_not_crash_the_elector(kube):
    """500s and timeouts: the holder stops believing it leads after its validity, keeps running, and wins it back."""
    emu, api = kube
    a = elector(api, "a", ttl=1.0)
    async with running(a):
        await until(a.leading)
        failing = [emu.fail(method, "leases", status=500, times=10_000) for method in ("GET", "PUT", "POST")]
        await until(lambda: not a.leading())
        await until(lambda: failing[0].times < 10_000)  # it kept trying (its campaign reads the Lease)
        for fault in failing:
            fault.times = 0
        await until(a.leading)
        assert a.terms == 2 and holder_of(emu) == "a"

        slow = [emu.fail(method, "leases", status=None, delay=3.0, times=10_000) for method in ("GET", "PUT")]
        await until(lambda: not a.leading())
        for fault in slow:
            fault.times = 0
        await until(a.leading)
        assert a.terms == 3 and holder_of(emu) == "a"


# ---------------------------------------------------------------- two scheduler loops

NODES = block_rack_nodes(2, 2, 2, 8)  # 64 GPUs


def job(name: str) -> JobSubmitted:
    return JobSubmitted(
        at=int(time.time()),
        job=JobId(name),
        queue=QueueName("q"),
        podsets=[PodSet(name="w", count=1, requests={"gpu": 8})],
    )


async def wait_for(
    store: EventStore, predicate: Callable[[list[StoredEvent]], bool], seconds: float = DEADLINE
) -> list[StoredEvent]:
    """Read the log until `predicate(events)` holds (this file's deadline)."""
    return await loopkit.wait_for(store, predicate, seconds)


def leaders(events: list[StoredEvent]) -> list[LeaderElected]:
    return [s.event for s in events if isinstance(s.event, LeaderElected)]


def admissions(events: list[StoredEvent]) -> dict[str, list[JobAdmitted]]:
    out: dict[str, list[JobAdmitted]] = {}
    for s in events:
        if isinstance(s.event, JobAdmitted):
            out.setdefault(s.event.job, []).append(s.event)
    return out


class Replica:
    """One daemon (its own NATS connection, Lease elector and simulated cluster) in the test's event loop."""

    def __init__(self, store: EventStore, api: ApiClient, name: str) -> None:
        self.store, self.api, self.name = store, api, name
        self.elector = elector(api, name)
        self.clusters: list[SimulatedCluster] = []
        self.scope = anyio.CancelScope()
        self.loop: SchedulerLoop | None = None

    def _cluster(self, state: Any) -> SimulatedCluster:
        cluster = SimulatedCluster(NODES, state, report_started=False)
        self.clusters.append(cluster)
        return cluster

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        url = self.store.nc.connected_url.geturl()
        own = await EventStore.connect(url, stream=self.store.stream, prefix=self.store.prefix, create=False)
        try:
            with self.scope:
                self.loop = SchedulerLoop(
                    own,
                    elector=self.elector,
                    cluster=self._cluster,
                    options=LoopOptions(lease_check=0.05, catch_up_timeout=10),
                )
                async with anyio.create_task_group() as tg:
                    await tg.start(self.loop.run)
                    task_status.started()
        finally:
            with anyio.CancelScope(shield=True):
                await own.close()


async def test_two_loops_on_lease_election_fail_over_without_doubling_a_decision(store, kube):
    """Two daemons on one Lease: one leads; it crashes; the other takes over with the next epoch, no job twice."""
    emu, api = kube
    await store.append(
        [
            SchedulerConfigured(at=0, levels=["muster.dev/block", "muster.dev/rack"]),
            QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 64}),
        ]
    )
    a, b = Replica(store, api, "a"), Replica(store, api, "b")
    async with anyio.create_task_group() as tg:
        await tg.start(a.run)
        await wait_for(store, lambda ev: len(leaders(ev)) == 1)
        await tg.start(b.run)
        for i in range(3):
            await store.append([job(f"before-{i}")])
        await wait_for(store, lambda ev: len(admissions(ev)) == 3)

        a.scope.cancel()  # a crash: no resign, the Lease is left to expire
        for i in range(3):
            await store.append([job(f"during-{i}")])
        await wait_for(store, lambda ev: len(leaders(ev)) == 2)
        for i in range(2):
            await store.append([job(f"after-{i}")])
        events = await wait_for(store, lambda ev: len(admissions(ev)) == 8)
        assert b.loop is not None
        await until(lambda: b.loop is not None and b.loop.leading)
        # b re-applies the earlier term's admissions after its first cycle, so wait for them
        await until(lambda: applied_admissions(b) == set(admissions(events)))
        tg.cancel_scope.cancel()

    assert [(e.epoch, e.holder) for e in leaders(events)] == [(1, "a"), (2, "b")]
    assert {job: len(adm) for job, adm in admissions(events).items()} == {job: 1 for job in admissions(events)}
    epoch = 0
    for s in events:  # no decision of an epoch older than the LeaderElected before it
        if isinstance(s.event, LeaderElected):
            epoch = s.event.epoch
        elif isinstance(s.event, DECISION_TYPES):
            assert s.event.epoch == epoch, s
    assert a.elector.valid_until <= b.elector.acquired_at
    assert holder_of(emu) == "b" and lease_of(emu)["spec"]["leaseTransitions"] == 1
    assert applied_admissions(b) == set(admissions(events))


def applied_admissions(replica: Replica) -> set[JobId]:
    """The jobs whose admissions a replica's clusters applied."""
    return {e.job for c in replica.clusters for e in c.applied if isinstance(e, JobAdmitted)}


# ---------------------------------------------------------------- the daemon as the chart configures it


async def test_the_daemon_elects_itself_on_a_lease_and_releases_it_on_sigterm(store, kube, nats_url, tmp_path):
    """`muster daemon` with backend lease (the chart's option): creates the Lease, leads, releases it on SIGTERM."""
    emu, api = kube
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "double", "cluster": {"server": api.configuration.host}}],
        "users": [{"name": "muster", "user": {}}],
        "contexts": [{"name": "double", "context": {"cluster": "double", "user": "muster"}}],
        "current-context": "double",
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    config = {"leader_election": {"backend": "lease", "ttl_seconds": 60, "lease_name": NAME}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = [
        sys.executable, "-m", "muster.cli", "daemon", "--config", str(tmp_path / "config.yaml"),
        "--nats", nats_url, "--stream", store.stream, "--subject-prefix", store.prefix,
        "--kubeconfig", str(tmp_path / "kubeconfig"), "--simulated-cluster", "1x1x2x8",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "POD_NAME": "muster-0", "POD_NAMESPACE": NS}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with open(tmp_path / "stderr.log", "wb") as err:  # noqa: ASYNC230 - the child writes to a real file
        proc = await anyio.open_process(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
    async with proc:
        try:
            # 60 s: a cold interpreter start on a busy box; an early exit ends the wait at once
            events = await wait_for(store, lambda ev: proc.returncode is not None or len(leaders(ev)) == 1, 60)
            assert proc.returncode is None, (tmp_path / "stderr.log").read_text()
            assert holder_of(emu) == "muster-0"
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
    log = (tmp_path / "stderr.log").read_text()
    assert code == 0, log
    assert [(e.epoch, e.holder) for e in leaders(events)] == [(1, "muster-0")]
    spec = lease_of(emu)["spec"]
    assert "holderIdentity" not in spec and spec["leaseTransitions"] == 0  # released, not left to expire (60 s)
    assert "leader lease released" in log

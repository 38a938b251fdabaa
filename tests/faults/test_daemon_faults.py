"""`muster daemon` processes killed -9 and paused while gangs arrive: the invariants hold after every fault.

Two daemon replicas (separate processes, NATS KV lease with a 1 s TTL) run
against the Kubernetes API double, which records every binding it applied;
a simulated kubelet runs the bound pods for a second; gangs (batch Jobs of
two pods) arrive at a steady rate.

- kill -9 of the leader at a random moment, a new replica started in its
  place: a standby takes over, decides again, and after every takeover the log
  and the cluster break no invariant (replay/invariants.py). At the end every
  gang was submitted once, bound whole, and finished.
- kill -9 of nats-server itself: the daemons reconnect, catch up with the
  log and go on; nothing is lost or doubled.
- SIGSTOP of the leader until its lease expired and the standby leads, then
  SIGCONT: for a while both believe they lead; no binding the API applied
  disagrees with the log's effective admissions.

`bench/reliability.py` runs the same with more faults and a higher rate.
"""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import pytest
from daemonkit import TTL, World, admitted_after, admitted_in, describe, elected_after, world

from muster.events.embedded import EmbeddedNats
from muster.events.types import JobFailed, JobFinished, JobSubmitted

pytestmark = pytest.mark.faults

KILLS = 3
PAUSES = 3
NATS_KILLS = 2
RATE = 20.0


async def settle_all(w: World, seconds: float = 60.0) -> None:
    """Stop submitting and wait until every gang created is on the log and finished."""
    w.stop_submitting()

    def done(log: list) -> bool:
        submitted = {s.event.source: s.event.job for s in log if isinstance(s.event, JobSubmitted)}
        finished = {s.event.job for s in log if isinstance(s.event, JobFinished)}
        return all(src in submitted and submitted[src] in finished for src in w.created)

    try:
        await w.wait_log(done, seconds)
    except TimeoutError:
        log = w.log()
        submitted = {s.event.source: s.event.job for s in log if isinstance(s.event, JobSubmitted)}
        status = w.check().status
        missing = [src for src in w.created if src not in submitted]
        stuck = {submitted[src]: status.get(submitted[src]) for src in w.created if src in submitted}
        stuck = {j: st for j, st in stuck.items() if st != "finished"}
        raise AssertionError(
            f"not submitted: {missing[:5]}; not finished: {list(stuck.items())[:5]}\n" + why_stuck(w, list(stuck)[:5])
        ) from None


def why_stuck(w: World, jobs: list[str]) -> str:
    """What the log and the daemons said about `jobs`: JobFailed reasons, and each daemon's log lines naming them."""
    out = []
    for job in jobs:
        failed = [s for s in w.log() if isinstance(s.event, JobFailed) and s.event.job == job]
        out += [f"{job}: JobFailed at seq {s.seq}: {s.event.reason!r}" for s in failed]
        for name, d in w.daemons.items():
            lines = [line for line in d.log_text().splitlines() if job in line]
            out += [f"  {name}: {line[:400]}" for line in lines[-8:]]
    return "\n".join(out)


async def test_leader_killed_9_at_random_moments_keeps_every_invariant(nats_url: str, tmp_path: Path) -> None:
    """After each kill -9 a standby takes over and decides; every gang is submitted once, bound whole, finished."""
    rng = random.Random(7)
    async with world(nats_url, tmp_path) as w:
        w.start_daemon()
        w.start_daemon()
        await w.wait_log(lambda log: w.leader()[0] > 0)
        w.tg.start_soon(w.submit, RATE)
        for _ in range(KILLS):
            epoch, holder = w.leader()
            await w.wait_log(admitted_in(epoch))
            await anyio.sleep(rng.uniform(0.1, 1.0))
            w.daemons[holder].kill()
            w.start_daemon()  # the replacement comes up as a standby
            # a takeover: the wait's own deadline is the bound (a busy CI box stretches any tighter one)
            await w.wait_log(elected_after(epoch), 10 * TTL + 10)
            await w.wait_log(admitted_after(epoch))
            report = w.check()
            assert report.ok, describe(report, w)
        await settle_all(w)
        report = w.check(settled=True)
        assert report.ok, describe(report, w)
        assert all(n == 1 for n in w.sources().values()), "a gang was submitted twice"
        assert set(w.sources()) == set(w.created)
        assert len(w.emulator.bound) == 2 * len(w.created), "a pod was bound twice or not at all"


async def test_paused_leader_resuming_after_its_lease_expired_applies_no_conflicting_binding(
    nats_url: str, tmp_path: Path
) -> None:
    """SIGSTOP the leader past its lease, let the standby lead, SIGCONT: every applied binding matches the log."""
    rng = random.Random(11)
    async with world(nats_url, tmp_path) as w:
        w.start_daemon()
        w.start_daemon()
        await w.wait_log(lambda log: w.leader()[0] > 0)
        w.tg.start_soon(w.submit, RATE)
        paused_names: list[str] = []
        for _ in range(PAUSES):
            epoch, holder = w.leader()
            paused_names.append(holder)
            await w.wait_log(admitted_in(epoch))
            await anyio.sleep(rng.uniform(0.05, 0.5))
            paused = w.daemons[holder]
            paused.pause()
            try:
                await w.wait_log(elected_after(epoch), 10 * TTL + 10)
                await w.wait_log(admitted_after(epoch))
                await anyio.sleep(rng.uniform(0.0, 0.5))
            finally:
                paused.resume()  # it wakes up believing it leads, with decisions of its old epoch in hand
            await anyio.sleep(2 * TTL)
            report = w.check()
            assert report.ok, describe(report, w)
        await settle_all(w)
        report = w.check(settled=True)
        assert report.ok, describe(report, w)
        assert len(w.emulator.bound) == 2 * len(w.created)
        assert w.leader()[0] >= PAUSES + 1, "a pause did not hand leadership over"
        for name in paused_names:  # each woke up believing it led, and found out
            assert "stepping down" in w.daemons[name].log_text(), name


async def test_nats_server_killed_under_the_daemons_is_caught_up_after(own_nats: EmbeddedNats, tmp_path: Path) -> None:
    """kill -9 of nats-server under two daemons and arriving gangs: they reconnect, catch up, and break nothing."""
    rng = random.Random(5)
    async with world(own_nats.url, tmp_path) as w:
        w.start_daemon()
        w.start_daemon()
        await w.wait_log(lambda log: w.leader()[0] > 0)
        w.tg.start_soon(w.submit, RATE)
        for _ in range(NATS_KILLS):
            await w.wait_log(admitted_after(0))
            await anyio.sleep(rng.uniform(0.5, 1.5))
            before = len(w.log())
            own_nats.kill()
            await own_nats.arestart()
            await w.wait_log(lambda log, n=before: len(log) > n + 20)  # decisions flow again
            report = w.check()
            assert report.ok, describe(report, w)
        await settle_all(w)
        report = w.check(settled=True)
        assert report.ok, describe(report, w)
        assert all(n == 1 for n in w.sources().values())
        assert len(w.emulator.bound) == 2 * len(w.created)

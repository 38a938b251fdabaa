"""Reliability report: the fault scenarios of tests/faults at larger counts, one table (not a test).

Scenarios (each on the real embedded nats-server, the Kubernetes API double, `muster daemon` processes):

  nats kill -9        the only nats-server killed and restarted under 100 submissions/s
  cluster leader      3-node JetStream cluster, stream at 3 replicas: kill a follower, then the stream leader
  kube API faults     500s, lost answers (timeouts), 429s, watches closed every 0.15 s, 410s; admit and preempt gangs
  billing crash       the billing subscriber killed between fetch, write and ack, restarted, ledger compared
  daemon kill -9      the leading `muster daemon` killed at a random moment while gangs arrive; a new replica started
  daemon pause        the leader SIGSTOPped past its lease, the standby leads, then SIGCONT (two believe they lead)
  takeover            the leading `muster daemon` killed (kill -9) while gangs arrive; the running standby takes over
  warm start          a replica started on a long log (--events, 10 M) with the sidecar's snapshot near its end

Columns: faults injected, jobs submitted (acknowledged), jobs lost, duplicate bindings (or events stored
twice), invariant violations (replay/invariants.py), time to recover p50/p99 in seconds (appends blocked
across a restart; takeover by a new leader; restart of the subscriber; kill -9 of the leader to the
standby's first admission; start of a replica to its first admission). Lost, duplicates and violations
must all be 0; the script exits 1 otherwise.

Usage: python bench/reliability.py [--quick] [--only NAME ...] [--seed N] [--events N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "faults"))

from daemonkit import admitted_after, elected_after, world  # noqa: E402
from faultkit import (  # noqa: E402
    DaemonProcess,
    Follower,
    JetStreamCluster,
    Load,
    config_events,
    percentile,
    stream_leader,
)
from longlog import LONG_LOG_CLUSTER, LongLog, kept_long_log, write_into  # noqa: E402

from muster.events.embedded import EmbeddedNats  # noqa: E402
from muster.events.store import EventStore  # noqa: E402
from muster.events.types import DECISION_TYPES, JobAdmitted, JobFinished, JobSubmitted  # noqa: E402
from muster.replay.invariants import check_log  # noqa: E402


@dataclass
class Row:
    name: str
    faults: dict[str, int] = field(default_factory=dict)
    jobs: int = 0
    lost: int = 0
    duplicates: int = 0
    violations: int = 0
    recover: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicates == 0 and self.violations == 0  # -1: did not finish


# ---------------------------------------------------------------- store scenarios


async def nats_kills(tmp: Path, kills: int, rng: random.Random) -> Row:
    row = Row("nats kill -9")
    with EmbeddedNats(tmp / "nats", stop_timeout=5) as server:
        async with await EventStore.connect(
            server.url, stream="R", prefix="r", request_timeout=1, duplicate_window=120
        ) as es:
            await es.append(config_events())
            load = Load(es, rate=100, batch=5)
            follower = Follower(es)
            windows = []
            async with anyio.create_task_group() as tg:
                await tg.start(follower.run)
                await tg.start(load.run)
                for _ in range(kills):
                    await anyio.sleep(rng.uniform(0.3, 1.5))
                    await load.next_attempt()
                    started = anyio.current_time()
                    server.kill()
                    await server.arestart()
                    windows.append((started, anyio.current_time()))
                await anyio.sleep(0.5)
                await load.drain()
                await follower.wait_for_seq(await es.last_seq())
                tg.cancel_scope.cancel()
            stored = await es.read()
    jobs = [s.event.job for s in stored if isinstance(s.event, JobSubmitted)]
    row.faults = {"kill -9": kills}
    row.jobs = len(load.acknowledged)
    row.lost = len(set(load.acknowledged) - set(jobs))
    row.duplicates = len(jobs) - len(set(jobs))
    row.violations = len(check_log(stored, submitted=load.acknowledged).violations)
    row.violations += int([s.seq for s in follower.seen] != [s.seq for s in stored])
    row.recover = [max(load.overlapping(a, b), default=0.0) for a, b in windows]
    return row


async def cluster_leader(tmp: Path, rounds: int, rng: random.Random) -> Row:
    row = Row("cluster leader")
    cluster = JetStreamCluster(tmp / "cluster").start()
    try:
        await cluster.wait_ready()
        es = await EventStore.connect(
            ",".join(cluster.urls), stream="HA", prefix="ha", replicas=3, request_timeout=2, duplicate_window=120
        )
        async with es:
            await es.append(config_events())
            load = Load(es, rate=100, batch=5)
            kills = 0
            async with anyio.create_task_group() as tg:
                await tg.start(load.run)
                for _ in range(rounds):
                    for victim_kind in ("follower", "leader"):
                        await anyio.sleep(rng.uniform(0.5, 1.5))
                        leader = await stream_leader(es)
                        names = [f"n{i}" for i in range(3)]
                        victim = leader if victim_kind == "leader" else next(n for n in names if n != leader)
                        before = len(load.acknowledged)
                        await load.next_attempt()
                        started = time.monotonic()
                        cluster.by_name(victim).kill()
                        kills += 1
                        await load.wait_acknowledged(before + 25, 60)
                        row.recover.append(time.monotonic() - started)
                        await cluster.by_name(victim).astart()  # back, so the next kill keeps a quorum
                        await cluster.wait_ready()
                await load.drain()
                tg.cancel_scope.cancel()
            stored = await es.read()
    finally:
        cluster.stop()
    jobs = [s.event.job for s in stored if isinstance(s.event, JobSubmitted)]
    row.faults = {"kill -9": kills}
    row.jobs = len(load.acknowledged)
    row.lost = len(set(load.acknowledged) - set(jobs))
    row.duplicates = len(jobs) - len(set(jobs))
    row.violations = len(check_log(stored, submitted=load.acknowledged).violations)
    row.note = "recover = kill to 25 more acks"
    return row


# ---------------------------------------------------------------- Kubernetes API faults


async def kube_faults(tmp: Path, rounds: int, rng: random.Random) -> Row:
    import test_kube_faults as kf  # the test's scenario, run with its assertions

    row = Row("kube API faults")
    started_all = time.monotonic()
    for _ in range(rounds):
        started = time.monotonic()
        await kf.test_bindings_and_evictions_apply_once_through_api_faults()
        row.recover.append(time.monotonic() - started)
    gangs = 8
    row.faults = {"500": rounds * (gangs + 3), "lost answer": rounds * (gangs + 3), "429": rounds * 3}
    row.faults["watch closed/410"] = int((time.monotonic() - started_all) / 0.15)
    row.jobs = rounds * gangs
    row.note = "each round asserts bindings/evictions once (else it raises); recover = round time"
    return row


# ---------------------------------------------------------------- billing


async def billing_crashes(tmp: Path, crashes: int, rng: random.Random) -> Row:
    sys.path.insert(0, str(ROOT / "tests" / "daemon"))
    import test_billing_subscriber as tb

    row = Row("billing crash")
    with EmbeddedNats(tmp / "billing-nats", stop_timeout=5) as server:
        async with await EventStore.connect(server.url, stream="BILL", prefix="bill") as es:
            log: list[Any] = [*tb.scripted_log()]
            log.insert(9, tb.BAD)
            await tb.publish(es, log)
            await tb.Process(server.url, "BILL", tmp / "clean.db").run_once()
            await es.js.delete_consumer("BILL", "billing")
            points = ("after_fetch", "after_write", "after_ack")
            fired = 0
            for _ in range(crashes):
                hooks = tb.CrashAt(rng.choice(points), rng.randint(1, 4))
                started = time.monotonic()
                try:
                    await tb.Process(server.url, "BILL", tmp / "crashy.db", hooks=hooks).run_once()
                except tb.Crash:
                    fired += 1
                row.recover.append(time.monotonic() - started)
            await tb.Process(server.url, "BILL", tmp / "crashy.db").run_once()
    same = tb.dump(tmp / "crashy.db") == tb.dump(tmp / "clean.db")
    row.faults = {"crash": fired}
    row.jobs = len(log)
    row.lost = row.duplicates = 0 if same else 1
    row.note = "jobs = events; ledger after crashes == ledger of one clean pass"
    return row


# ---------------------------------------------------------------- daemons


async def daemon_faults(tmp: Path, count: int, rng: random.Random, *, pause: bool, rate: float, ttl: float) -> Row:
    row = Row("daemon pause" if pause else "daemon kill -9")
    async with world(_nats_url(tmp), tmp, nodes=max(16, int(rate * 2 * 1.5 / 8)), ttl=ttl) as w:
        w.start_daemon()
        w.start_daemon()
        await w.wait_log(lambda log: w.leader()[0] > 0)
        w.tg.start_soon(w.submit, rate)
        done_faults = 0
        for k in range(count):
            epoch, holder = w.leader()
            try:
                await w.wait_log(admitted_after(epoch - 1), 60)
                await anyio.sleep(rng.uniform(0.1, 1.5))
                victim = w.daemons[holder]
                started = time.monotonic()
                if pause:
                    victim.pause()
                    await w.wait_log(elected_after(epoch), 10 * ttl + 20)
                    row.recover.append(time.monotonic() - started)
                    await w.wait_log(admitted_after(epoch), 60)
                    await anyio.sleep(rng.uniform(0.0, 0.5))
                    victim.resume()
                else:
                    victim.kill()
                    w.start_daemon()
                    await w.wait_log(elected_after(epoch), 10 * ttl + 20)
                    row.recover.append(time.monotonic() - started)
                    await w.wait_log(admitted_after(epoch), 60)
            except TimeoutError:
                churn = w.leader()[0] - epoch
                row.note = f"STALLED after fault {k + 1}: no admission for 60 s ({churn} leader terms since); "
                done_faults = k + 1
                break
            done_faults = k + 1
            # in a thread: a check of the whole log takes seconds, and this process also serves the API double
            report = await anyio.to_thread.run_sync(w.check)
            row.violations = max(row.violations, len(report.violations))
        count = done_faults
        w.stop_submitting()

        def done(log: list[Any]) -> bool:
            submitted = {s.event.source: s.event.job for s in log if isinstance(s.event, JobSubmitted)}
            finished = {s.event.job for s in log if isinstance(s.event, JobFinished)}
            return all(src in submitted and submitted[src] in finished for src in w.created)

        # Counted as lost below: what has not finished once gangs stop finishing for a while. A backlog
        # (a 2-core machine runs slower than the arrival rate) is drained, not reported as lost.
        settle_started = progress_at = time.monotonic()
        finished_before = seen = _finished(w.log())
        idle = 20 if row.note else 60
        while not done(w.log()) and time.monotonic() - settle_started < 1200:
            await anyio.sleep(1.0)
            if (n := _finished(w.log())) > seen:
                seen, progress_at = n, time.monotonic()
            elif time.monotonic() - progress_at > idle:
                break
        settled_in = time.monotonic() - settle_started
        drained = _finished(w.log()) - finished_before
        report = w.check(settled=True)
        log = w.log()
        submitted = {s.event.source: s.event.job for s in log if isinstance(s.event, JobSubmitted)}
        finished = {s.event.job for s in log if isinstance(s.event, JobFinished)}
        row.faults = {"SIGSTOP+SIGCONT" if pause else "kill -9": count}
        row.jobs = len(w.created)
        row.lost = sum(1 for src in w.created if src not in submitted or submitted[src] not in finished)
        pods = [key for _, key, _ in w.emulator.bound]
        row.duplicates = len(pods) - len(set(pods)) + sum(n - 1 for n in w.sources().values())
        row.violations = max(row.violations, len(report.violations))
        row.note += f"{report.decisions} decisions, {report.fenced} fenced, {report.duplicate_facts} end facts repeated"
        row.note += f"; lease TTL {ttl:g} s; recover = fault to new LeaderElected"
        row.note += f"; backlog after the faults: {drained} gangs finished in {settled_in:.0f} s"
        for v in report.violations[:10]:
            print(f"    violation: {v}", file=sys.stderr)
        doubled = sorted({k for k in pods if pods.count(k) > 1})[:5]
        for key in doubled:
            print(f"    bound more than once: {key}: {[b for b in w.emulator.bound if b[1] == key]}", file=sys.stderr)
        lost = [src for src in w.created if src not in submitted or submitted[src] not in finished][:5]
        for src in lost:
            print(
                f"    not finished: {src} -> {submitted.get(src)} {report.status.get(submitted.get(src, ''))}",
                file=sys.stderr,
            )
    return row


@dataclass(frozen=True)
class Takeover:
    """One takeover: when the new leader passed each step, in seconds after the kill, and its CPU seconds to it."""

    steps: dict[str, float]
    """Lease won, `LeaderElected`, cluster synced (from its log) and its first decision of any kind (on the log)."""
    admitted: float
    cpu: float


MILESTONES = {"leader lease won": "lease", "leading": "elected", "cluster synced": "synced"}
"""Lines of a daemon's log that mark its way to leading (message -> step name)."""
START_MILESTONES = {
    "starting": "started",
    "starting from a snapshot": "snapshot loaded",
    "caught up with the log": "caught up",
    "leading": "elected",
}
"""The same for a replica's start."""


def _decided_after(epoch: int) -> Callable[[list[Any]], bool]:
    """A decision of any kind (an admission, a job found inadmissible...) by a later leader."""
    return lambda log: any(isinstance(s.event, DECISION_TYPES) and getattr(s.event, "epoch", 0) > epoch for s in log)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _steps(log_text: str, since_wall: float, milestones: dict[str, str] = MILESTONES) -> dict[str, float]:
    """The first time after `since_wall` each milestone appears in a daemon's JSON log, relative to it."""
    found: dict[str, float] = {}
    for line in log_text.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            entry = json.loads(line)
            step = milestones.get(entry["event"])
            at = datetime.datetime.fromisoformat(entry["timestamp"]).timestamp() - since_wall
            if step is not None and step not in found and at >= 0:
                found[step] = at
    return found


async def takeover(tmp: Path, count: int, rng: random.Random, *, rate: float, ttl: float) -> Row:
    """kill -9 of the leader; the standby (already following the log) takes over: time to its first admission."""
    row = Row("takeover")
    runs: list[Takeover] = []
    async with world(_nats_url(tmp), tmp, nodes=max(16, int(rate * 2 * 1.5 / 8)), ttl=ttl) as w:
        standbys = [w.start_daemon(), w.start_daemon()]
        await w.wait_log(lambda log: w.leader()[0] > 0)
        w.tg.start_soon(w.submit, rate)
        for k in range(count):
            epoch, holder = w.leader()
            try:
                for standby in standbys:  # the standby taking over has folded the log and watches the cluster
                    await standby.wait_caught_up()
                await w.wait_log(admitted_after(epoch - 1), 60)
                await anyio.sleep(rng.uniform(0.1, 1.5))
                cpu = {name: _cpu_seconds(d.proc.pid) for name, d in w.daemons.items() if d.alive and name != holder}
                killed, killed_wall = time.monotonic(), time.time()
                w.daemons[holder].kill()
                await w.wait_log(_decided_after(epoch), 10 * ttl + 20)
                decided = time.monotonic() - killed
                await w.wait_log(admitted_after(epoch), 10 * ttl + 20)
                admitted = time.monotonic() - killed
                new = w.daemons[w.leader()[1]]
                used = _cpu_seconds(new.proc.pid) - cpu.get(new.identity, 0.0)
                runs.append(Takeover({**_steps(new.log_text(), killed_wall), "decided": decided}, admitted, used))
                row.recover.append(admitted)
            except TimeoutError:
                row.note = f"STALLED after kill {k + 1}: no admission by a new leader; "
                break
            row.faults = {"kill -9": k + 1}
            standbys = [w.start_daemon()]  # the next standby
        w.stop_submitting()

        def missing(log: list[Any]) -> list[str]:
            on_log = {s.event.source for s in log if isinstance(s.event, JobSubmitted)}
            return [src for src in w.created if src not in on_log]

        with contextlib.suppress(TimeoutError):  # lost: a gang created in the cluster never reaches the log
            await w.wait_log(lambda log: not missing(log), 60)
        # no binding from here on, and the log read to its end: every binding's admission is in what is checked
        await anyio.to_thread.run_sync(w.stop_all)
        await w.follower.wait_for_seq(await w.store.last_seq())
        report = await anyio.to_thread.run_sync(w.check)
        pods = [key for _, key, _ in w.emulator.bound]
        row.jobs = len(w.created)
        row.lost = len(missing(w.log()))
        row.duplicates = len(pods) - len(set(pods))
        row.violations = len(report.violations)
        for v in report.violations[:10]:
            print(f"    violation: {v}", file=sys.stderr)
        worst = max(row.recover, default=0.0)
        row.note += f"lease TTL {ttl:g} s: target <= {ttl + 1:g} s, worst {worst:.2f} s"
        for step in [*MILESTONES.values(), "decided"]:
            times = [r.steps[step] for r in runs if step in r.steps]
            row.note += f"; kill to {step} p50 {percentile(times, 50):.2f} s"
        cpus = [r.cpu for r in runs]
        row.note += f"; new leader's CPU from kill to first admission p50 {percentile(cpus, 50):.2f} s"
        row.note += f", max {max(cpus, default=0.0):.2f} s"
        row.note += "; recover = kill to the first admission by the new leader (its lease waits out the TTL)"
        for i, r in enumerate(runs, 1):
            steps = " ".join(f"{k} {v:.2f}" for k, v in r.steps.items())
            print(f"    takeover {i}: {steps} admitted {r.admitted:.2f} s, {r.cpu:.2f} s CPU", file=sys.stderr)
    return row


async def warm_start(tmp: Path, events: int, kept: Path | None) -> Row:
    """`muster daemon` started on a long log with a snapshot near its end: from its start to its first admission."""
    if kept is None:
        async with await EventStore.connect(_nats_url(tmp), stream="WARM", prefix="warm", duplicate_window=10) as es:
            return await _start_on(es, await write_into(es, events=events), tmp)
    work = tmp / "nats"
    long = await kept_long_log(kept / str(events), work, events=events, stream="WARM", prefix="warm")
    with EmbeddedNats(work, stop_timeout=60) as server:
        async with await EventStore.connect(server.url, stream="WARM", prefix="warm", duplicate_window=10) as es:
            return await _start_on(es, long, tmp)


async def _start_on(es: EventStore, long: LongLog, tmp: Path) -> Row:
    """A new `muster daemon` process (the only replica, the long log's cluster simulated), timed from its spawn
    to the admission of a job of the log's tail, as seen on the stream."""
    row = Row("warm start")
    admitted: set[str] = set()
    args = ["--nats", es.nc.connected_url.geturl(), "--stream", es.stream, "--subject-prefix", es.prefix]
    args += ["--leader-backend", "none", "--simulated-cluster", LONG_LOG_CLUSTER]
    cpu = 0.0
    started, started_wall = time.monotonic(), time.time()
    daemon = DaemonProcess("warm", args, tmp)
    try:
        with anyio.fail_after(600):
            async with contextlib.aclosing(es.follow(long.end + 1)) as stream:
                async for stored in stream:
                    if isinstance(stored.event, JobAdmitted) and stored.event.job in long.pending:
                        if not admitted:
                            row.recover.append(time.monotonic() - started)
                            cpu = _cpu_seconds(daemon.proc.pid)
                        admitted.add(stored.event.job)
                        if len(admitted) == len(long.pending):
                            break
    finally:
        daemon.stop()
    steps = _steps(daemon.log_text(), started_wall, START_MILESTONES)
    print("    warm start: " + " ".join(f"{k} {v:.2f}" for k, v in steps.items()), file=sys.stderr)
    row.faults = {"cold start": 1}
    row.jobs = len(long.pending)
    row.lost = len(long.pending) - len(admitted)
    row.note = (
        f"{long.end:,} events on the log (written in {long.seconds:.0f} s), snapshot at {long.snapshot_seq:,}: "
        f"folds {long.end - long.snapshot_seq:,}; recover = process start to first admission, target < 5 s; "
        f"{cpu:.2f} s CPU to it"
    )
    return row


def _finished(log: list[Any]) -> int:
    return sum(1 for s in log if isinstance(s.event, JobFinished))


_URL: dict[str, str] = {}


def _nats_url(tmp: Path) -> str:
    """The shared nats-server of the run (daemon scenarios use their own stream on it)."""
    return _URL["url"]


# ---------------------------------------------------------------- main


def print_table(rows: list[Row]) -> None:
    head = ["scenario", "faults injected", "jobs", "lost", "dup", "violations", "recover p50", "p99"]
    lines = [head]
    for r in rows:
        faults = ", ".join(f"{n} {k}" for k, n in r.faults.items())
        p50, p99 = percentile(r.recover, 50), percentile(r.recover, 99)
        lines.append([r.name, faults, str(r.jobs), str(r.lost), str(r.duplicates), str(r.violations)])
        lines[-1] += [f"{p50:.2f} s", f"{p99:.2f} s"]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for i, line in enumerate(lines):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        if r.note:
            print(f"  {r.name}: {r.note}")


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    q = args.quick
    scenarios: dict[str, Callable[[Path], Coroutine[Any, Any, Row]]] = {
        "nats": lambda t: nats_kills(t, 3 if q else 10, rng),
        "cluster": lambda t: cluster_leader(t, 1 if q else 3, rng),
        "kube": lambda t: kube_faults(t, 1 if q else 5, rng),
        "billing": lambda t: billing_crashes(t, 6 if q else 40, rng),
        "daemon-kill": lambda t: daemon_faults(t, 3 if q else 20, rng, pause=False, rate=args.rate, ttl=args.ttl),
        "daemon-pause": lambda t: daemon_faults(t, 3 if q else 10, rng, pause=True, rate=args.rate, ttl=args.ttl),
        "takeover": lambda t: takeover(t, 3 if q else 10, rng, rate=args.rate, ttl=args.ttl),
        "warm-start": lambda t: warm_start(t, 200_000 if q else args.events, args.keep),
    }
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="muster-reliability-") as tmp,
        EmbeddedNats(Path(tmp) / "shared-nats", stop_timeout=5) as shared,
    ):
        _URL["url"] = shared.url
        for name, run in scenarios.items():
            if args.only and name not in args.only:
                continue
            folder = Path(tmp) / name
            folder.mkdir()
            started = time.monotonic()
            print(f"running {name} ...", file=sys.stderr, flush=True)
            try:
                row = await run(folder)
            except Exception as exc:  # a scenario that could not finish is a failed row, not a lost report
                import traceback

                traceback.print_exc()
                row = Row(name, note=f"FAILED: {type(exc).__name__}: {str(exc)[:200]}", violations=-1)
            print(f"  {name}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
            rows.append(row)
    print_table(rows)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI-sized counts")
    parser.add_argument(
        "--only",
        nargs="*",
        help="scenarios to run: nats cluster kube billing daemon-kill daemon-pause takeover warm-start",
    )
    parser.add_argument("--events", type=int, default=10_000_000, help="events on the log of the warm-start row")
    parser.add_argument(
        "--keep",
        type=Path,
        help="folder keeping the warm-start row's long log between runs (written once, copied for each run)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ttl", type=float, default=5.0, help="leader lease TTL of the daemons (seconds)")
    parser.add_argument("--rate", type=float, default=50.0, help="gangs per second for the daemon scenarios")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    sys.exit(anyio.run(main, parser.parse_args()))

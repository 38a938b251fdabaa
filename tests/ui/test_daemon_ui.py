"""The daemon serves the dashboard when its config has a `ui` section (the chart's ui.enabled)."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import yaml
from uikit import wait_for

from muster.daemon.config import ConfigError, load_config
from muster.daemon.daemoncli import serve
from muster.events.embedded import free_port


def write_config(tmp_path: Path, **sections: Any) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(sections))
    return path


@pytest.mark.parametrize(
    ("ui", "words"),
    [
        pytest.param({"port": 8321, "host": "0.0.0.0"}, "without a token", id="exposed-without-token"),
        pytest.param({"port": 8321, "token_file": "/nonexistent/token"}, "ui.token_file", id="missing-token-file"),
        pytest.param({"port": "web"}, "ui.port: 'web' is not a port number", id="bad-port"),
        pytest.param({"port": 8321, "tokenfile": "x"}, "unknown key ui.tokenfile", id="typo"),
    ],
)
def test_a_dashboard_config_that_cannot_work_is_refused(tmp_path: Path, ui: dict[str, Any], words: str) -> None:
    """A `ui` section the daemon cannot serve safely is a ConfigError (exit 2) naming the key."""
    with pytest.raises(ConfigError, match=words):
        load_config(str(write_config(tmp_path, ui=ui)), env={})


def test_the_dashboard_is_off_unless_configured(tmp_path: Path) -> None:
    """No `ui` section: no dashboard; a port alone: this machine only; a token file allows every address."""
    assert load_config(str(write_config(tmp_path)), env={}).ui_port is None
    local = load_config(str(write_config(tmp_path, ui={"port": 0})), env={})
    assert (local.ui_port, local.ui_host, local.ui_token_file) == (0, "127.0.0.1", None)
    (tmp_path / "token").write_text("t0ken\n")
    ui = {"port": 9000, "host": "0.0.0.0", "token_file": str(tmp_path / "token")}
    exposed = load_config(str(write_config(tmp_path, ui=ui)), env={})
    assert (exposed.ui_port, exposed.ui_host) == (9000, "0.0.0.0")


async def test_the_daemon_serves_its_stream_on_the_dashboard(tmp_path: Path, nats_url: str) -> None:
    """`muster daemon` with a ui port answers the dashboard's pages for its own stream, behind the token."""
    tag = uuid.uuid4().hex[:12]
    port = free_port()
    (tmp_path / "token").write_text("t0ken\n")
    path = write_config(
        tmp_path,
        nats={"url": nats_url, "stream": f"T{tag}", "subject_prefix": f"t{tag}"},
        leader_election={"backend": "nats-kv", "kv_bucket": f"lead-{tag}"},
        ui={"port": port, "token_file": str(tmp_path / "token")},
    )
    cfg = load_config(str(path), env={}, overrides={"simulated_cluster": "1x1x2x8", "identity": "muster-0"})
    url = f"http://127.0.0.1:{port}/api/cluster"
    nodes: list[str] = []
    async with anyio.create_task_group() as tg, aiohttp.ClientSession() as http:
        tg.start_soon(serve, cfg)

        async def both_nodes_shown() -> bool:
            nonlocal nodes
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(url, headers={"Authorization": "Bearer t0ken"}) as r:
                    if r.status == 200:
                        nodes = [n["node"] for d in (await r.json())["page"]["domains"] for n in d["nodes_list"]]
            return len(nodes) == 2

        await wait_for(both_nodes_shown, "the simulated cluster's two nodes on the dashboard", seconds=60)
        assert nodes == ["b0-r0-n0", "b0-r0-n1"]
        async with http.get(url) as r:
            assert r.status == 401
        tg.cancel_scope.cancel()

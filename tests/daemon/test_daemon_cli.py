"""`muster daemon` as the chart runs it: config file, env and flags, probes, metrics, JSON logs, SIGTERM."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import yaml

from muster.cli import main
from muster.daemon.config import ConfigError, load_config, nats_connect_options
from muster.daemon.endpoints import serve_http
from muster.daemon.loop import SchedulerLoop, SoleElector
from muster.demo.simcluster import SimulatedCluster, block_rack_nodes
from muster.events.embedded import free_port
from muster.events.store import EventStore
from muster.events.types import JobAdmitted, JobId, JobSubmitted, LeaderElected, PodSet, QueueConfigured, QueueName

MUSTER = str(Path(sys.executable).parent / "muster")


def chart_config(tmp_path: Path, url: str, stream: str, prefix: str, **extra: Any) -> Path:
    """The config.yaml the Helm chart renders (deploy/README.md), pointed at the test's NATS."""
    (tmp_path / "username").write_text("daemon\n")
    (tmp_path / "password").write_text("s3cret-do-not-log\n")
    cfg = {
        "nats": {
            "url": url,
            "stream": stream,
            "subject_prefix": prefix,
            "inbox_prefix": "_INBOX.muster-daemon",
            "max_event_bytes": 1048576,
        },
        "leader_election": {"backend": "nats-kv", "ttl_seconds": 10, "kv_bucket": f"lead-{prefix}"},
        "kubernetes": {"scheduler_name": "muster", "namespaces": []},
        "utilization": {"url": "", "source": "prometheus", "interval_seconds": 60},
        "http": {"health_port": 8080, "metrics_port": 9090},
        "log": {"level": "info", "format": "json"},
        "queues_file": "/etc/muster/queues.yaml",
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_flags_beat_environment_which_beats_the_file(tmp_path):
    """Each source overrides the previous one key by key; MUSTER_<SECTION>_<KEY> values are read as YAML."""
    path = chart_config(tmp_path, "nats://file:4222", "S", "p")
    env = {
        "MUSTER_HTTP_METRICS_PORT": "9191",
        "MUSTER_LEADER_ELECTION_TTL_SECONDS": "4",
        "MUSTER_NATS_URL": "nats://env",
    }
    cfg = load_config(str(path), env=env, overrides={"nats": {"url": "nats://flag:1"}, "http": {"health_port": None}})
    assert cfg.nats_urls == ["nats://flag:1"]
    assert (cfg.health_port, cfg.metrics_port, cfg.leader_ttl) == (8080, 9191, 4.0)
    assert cfg.unknown == []
    with pytest.raises(ConfigError, match="not supported"):
        load_config(str(path), env={"MUSTER_LEADER_ELECTION_BACKEND": "zookeeper"})


def test_credentials_are_read_from_their_files_and_never_described(tmp_path):
    """The password file's content reaches nats.connect only; the loggable description names files, not secrets."""
    path = chart_config(tmp_path, "nats://user:pw@host:4222", "S", "p")
    raw = yaml.safe_load(path.read_text())
    raw["nats"]["auth"] = {"username_file": str(tmp_path / "username"), "password_file": str(tmp_path / "password")}
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(str(path), env={})
    options = nats_connect_options(cfg)
    assert (options["user"], options["password"]) == ("daemon", "s3cret-do-not-log")
    described = json.dumps(cfg.describe())
    assert "s3cret" not in described and "pw@" not in described
    assert "password_file" in described


async def test_probes_and_metrics_follow_the_loop(store):
    """/readyz is 503 until the log is folded, then names the role; /metrics has the cycle, queue and leader series."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    nodes = block_rack_nodes(1, 1, 1, 8)
    loop = SchedulerLoop(store, elector=SoleElector("m"), cluster=lambda st: SimulatedCluster(nodes, st))
    async with anyio.create_task_group() as tg, aiohttp.ClientSession() as http:
        # port 0: the server binds a free port and reports it (no race with another process for a picked one)
        [port] = await tg.start(
            functools.partial(serve_http, loop, loop.metrics.registry, health_port=0, metrics_port=0)
        )
        base = f"http://127.0.0.1:{port}"
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 503
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        await tg.start(loop.run)
        with anyio.fail_after(30):
            await loop.first_term.wait()
        gang = [PodSet(name="w", count=1, requests={"gpu": 6})]
        now = int(time.time())
        await store.append([JobSubmitted(at=now, job=JobId(j), queue=QueueName("q"), podsets=gang) for j in "jk"])
        # The gauges show the loop's fold, which trails the log: wait until it has folded the admission
        # (generous deadline, returns at once on a quiet machine), then check every series.
        with anyio.fail_after(30):
            while True:
                async with http.get(f"{base}/metrics") as resp:
                    lines = _samples(await resp.text())
                if lines.get('muster_admitted_jobs{queue="q"}') == 1:
                    break
                await anyio.sleep(0.05)
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 200 and (await resp.text()).startswith("ready leader")
        loop.stop()
        tg.cancel_scope.cancel()
    assert any(isinstance(s.event, JobAdmitted) for s in await store.read())
    assert lines['muster_queue_usage{queue="q",resource="gpu"}'] == 6
    assert lines['muster_pending_jobs{queue="q"}'] == 1  # k waits: 6 + 6 > 8
    assert lines['muster_admitted_jobs{queue="q"}'] == 1
    assert lines["muster_leader"] == 1 and lines["muster_leader_epoch"] == 1
    assert lines["muster_cycle_duration_seconds_count"] >= 1
    assert "muster_log_lag_events" in lines


def _samples(text: str) -> dict[str, float]:
    """Prometheus text exposition as {series: value}."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"}


def test_the_daemon_runs_from_the_chart_config_and_stops_cleanly_on_sigterm(tmp_path, nats_url):
    """Started as the Deployment starts it: leads, serves probes, logs JSON without secrets, exits 0 on SIGTERM."""
    tag = uuid.uuid4().hex[:12]
    stream, prefix = f"T{tag}", f"t{tag}"
    health, metrics = free_port(), free_port()
    path = chart_config(tmp_path, nats_url, stream, prefix, http={"health_port": health, "metrics_port": metrics})
    raw = yaml.safe_load(path.read_text())
    raw["nats"]["auth"] = {}  # the session server has no users; the password file is still there, unread
    path.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "POD_NAME": "muster-0", "MUSTER_LOG_LEVEL": "info"}
    proc = subprocess.Popen(
        [MUSTER, "daemon", "--config", str(path), "--simulated-cluster", "1x1x2x8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60  # a cold interpreter start on a busy 2-core box
        ready = ""
        while time.monotonic() < deadline and "ready leader" not in ready:
            time.sleep(0.1)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=1) as resp:
                    ready = resp.read().decode()
            except OSError:
                continue
        assert "ready leader" in ready
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=2) as resp:
            assert b"muster_leader 1.0" in resp.read()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    events = [r["event"] for r in records]
    assert "leading" in events and "stepping down" in events and "leader lease released" in events
    assert all(r.get("replica") == "muster-0" for r in records if r.get("logger", "").startswith("muster"))
    assert "s3cret" not in err

    async def leaders() -> list[Any]:
        log = await EventStore.connect(nats_url, stream=stream, prefix=prefix, create=False)
        try:
            return [s.event for s in await log.read() if isinstance(s.event, LeaderElected)]
        finally:
            await log.delete_stream()
            await log.close()

    assert [(e.epoch, e.holder) for e in anyio.run(leaders)] == [(1, "muster-0")]


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        pytest.param(
            {"nats": {"strem": "MUSTER"}}, "unknown key nats.strem (valid: auth, inbox_prefix,", id="nats-strem"
        ),
        pytest.param(
            {"leader_elction": {}}, "unknown key leader_elction (valid: archive, http, identity,", id="top-level"
        ),
        pytest.param({"nats": {"tls": {"ca": "x"}}}, "unknown key nats.tls.ca (valid: ca_file,", id="nested"),
    ],
)
def test_a_config_key_typo_is_refused_naming_it_and_the_valid_keys(tmp_path, capsys, edit, words):
    """A misspelt key (`strem:`) exits 2 with its name and the keys that section takes, instead of a default."""
    path = chart_config(tmp_path, "nats://127.0.0.1:1", "S", "p")
    raw = yaml.safe_load(path.read_text())
    for key, value in edit.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key].update(value)
        else:
            raw[key] = value
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=re.escape(words)):
        load_config(str(path), env={})
    assert main(["daemon", "--config", str(path)]) == 2
    assert words in capsys.readouterr().err


def test_a_log_level_that_is_no_level_is_refused(tmp_path, capsys):
    """`log.level: loud` exits 2 naming the levels, for the daemon and for `billing run`, which the chart writes
    the same section for (the daemon logged at info, saying nothing of the typo; `billing run` never read it)."""
    path = chart_config(tmp_path, "nats://127.0.0.1:1", "S", "p")
    raw = yaml.safe_load(path.read_text())
    raw["log"] = {"level": "loud"}
    path.write_text(yaml.safe_dump(raw))
    assert main(["daemon", "--config", str(path)]) == 2
    assert "log.level must be one of debug, info, warning, error, not 'loud'" in capsys.readouterr().err
    assert main(["daemon", "--config", str(path), "--log-level", "DEBUG"]) != 2  # the flag over the file, any case
    billing = tmp_path / "billing.yaml"
    billing.write_text(yaml.safe_dump({"nats": raw["nats"], "log": {"level": "loud"}}))
    assert main(["billing", "run", "--config", str(billing), "--once"]) == 2
    assert "log.level must be one of debug, info, warning, error, not 'loud'" in capsys.readouterr().err


def test_the_archive_and_the_window_are_read_from_the_config_and_checked(tmp_path):
    """The archive and window come from the config, the stream's limits are the window times ceiling_factor."""
    path = chart_config(tmp_path, "nats://127.0.0.1:1", "S", "p")
    raw = yaml.safe_load(path.read_text())
    raw["archive"] = {"bucket": "MUSTER-archive", "segment_events": 500, "consumers": ["muster-billing", "audit"]}
    raw["archive"]["state_every_events"] = 2000
    raw["retention"] = {"max_age_seconds": 86400, "max_bytes": 1 << 30}
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(str(path), env={})
    assert (cfg.archive_location, cfg.archive_segment_events) == ("nats-object:MUSTER-archive", 500)
    assert cfg.archive_state_every == 2000
    assert (cfg.archive_consumers, cfg.retention_max_age, cfg.retention_max_bytes) == (
        ["muster-billing", "audit"],
        86400.0,
        1 << 30,
    )
    assert (cfg.retention_window, cfg.retention_ceiling) == ((86400.0, 1 << 30), (864000.0, 10 << 30))
    raw["retention"]["ceiling_factor"] = 3
    path.write_text(yaml.safe_dump(raw))
    assert load_config(str(path), env={}).retention_ceiling == (259200.0, 3 << 30)
    raw["retention"]["ceiling_factor"] = 0.5
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="ceiling_factor"):
        load_config(str(path), env={})
    raw["retention"]["ceiling_factor"] = 3
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="needs an archive"):
        load_config(str(path), env={"MUSTER_ARCHIVE_BUCKET": ""})
    with pytest.raises(ConfigError, match="not both"):
        load_config(str(path), env={"MUSTER_ARCHIVE_DIRECTORY": "/var/lib/muster/archive"})

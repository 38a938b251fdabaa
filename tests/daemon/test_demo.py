"""`muster demo`: the whole system in one command, ending on its own with a summary and a log to replay and bill."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import anyio
import pytest

from muster.daemon.k8s import manifests
from muster.daemon.utilization import samples_from_text
from muster.demo.dcgm import FakeDcgm
from muster.demo.workload import GPU_MODEL, demo_nodes, gpu_profile, next_gang
from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore

MUSTER = str(Path(sys.executable).parent / "muster")


@pytest.mark.slow
def test_demo_runs_for_its_duration_prints_the_summary_and_leaves_a_replayable_log(tmp_path):
    """`muster demo --duration 20` ends by itself; its log holds jobs and utilization, and bills used < allocated."""
    directory = tmp_path / "demo"
    proc = subprocess.run(
        # the end-to-end run: 20 s at the default speed submit ~60 gangs (~40 on a busy box)
        [MUSTER, "demo", "--duration", "20", "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "muster demo done after" in out
    events = int(re.search(r"([\d,]+) events on stream MUSTER", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert "muster replay --nats nats://127.0.0.1:" in out and "muster audit" in out
    port = int(re.search(r"-p (\d+) -sd", out).group(1))  # type: ignore[union-attr]

    async def read() -> Counter[str]:
        store = await EventStore.connect(f"nats://127.0.0.1:{port}", stream="MUSTER", create=False)
        try:
            return Counter(type(s.event).__name__ for s in await store.read())
        finally:
            await store.close()

    db = f"sqlite:///{tmp_path / 'billing.db'}"
    # serve the demo's store again, as the printed command does, and bill it
    with EmbeddedNats(directory / "nats", port=port):
        counts = anyio.run(read)
        billing = [MUSTER, "billing", "run", "--nats", f"nats://127.0.0.1:{port}", "--db", db, "--once"]
        run = subprocess.run(billing, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr[-2000:]
    report = [MUSTER, "billing", "report", "--db", db, "--rates", str(directory / "rates.yaml"), "--format", "json"]
    shown = subprocess.run(report, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr[-2000:]
    totals = json.loads(shown.stdout)["totals"]
    assert sum(counts.values()) == events
    assert counts["JobSubmitted"] > 10 and counts["JobAdmitted"] > 10 and counts["JobFinished"] > 0
    assert counts["LeaderElected"] == 1 and counts["NodeAdded"] == 64
    assert (directory / "daemon.log").read_text().count('"event": "leading"') == 1
    # the daemon's scraper read the demo's fake dcgm-exporter: billing sees used and idle GPUs
    assert counts["GpuUtilizationSampled"] > 0
    assert 0 < totals["used_gpu_hours"] < totals["sampled_gpu_hours"] <= totals["allocated_gpu_hours"]
    assert totals["idle_gpu_hours"] > 0 and totals["cost"] > 0
    assert "muster billing report --db" in out


def test_demo_refuses_a_folder_it_did_not_make(tmp_path):
    """A non-empty folder without the demo's marker is never wiped: exit 2 with the reason."""
    (tmp_path / "precious.txt").write_text("keep me")
    proc = subprocess.run(
        [MUSTER, "demo", "--duration", "1", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2
    assert "was not made by muster demo" in proc.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_the_fake_dcgm_exporter_reports_each_running_pods_gpus_at_its_gangs_profile():
    """The real scraper reads each running pod's GPUs at its gang's profile; free GPUs and pending pods give nothing."""
    nodes = demo_nodes(blocks=1, racks=1, nodes=2, gpus=8)
    labels, idle = {"muster.dev/gang": "busy"}, {"muster.dev/gang": "idle"}
    pods = [
        manifests.pod("busy-0", "team-a", gpus=4, labels=labels, node_name="b0-r0-n0", phase="Running"),
        manifests.pod("busy-1", "team-a", gpus=4, labels=labels, node_name="b0-r0-n0", phase="Running"),
        manifests.pod("idle-0", "team-b", gpus=2, labels=idle, node_name="b0-r0-n1", phase="Running"),
        manifests.pod("waiting-0", "team-b", gpus=2, labels=labels, node_name="b0-r0-n1", phase="Pending"),
        manifests.pod("other-0", "team-c", gpus=1, node_name="b0-r0-n1", phase="Running"),
    ]
    profiles = {"busy": 0.8, "idle": 0.01}

    def utilization(pod: dict) -> float | None:
        return profiles.get(pod["metadata"]["labels"].get("muster.dev/gang", ""))

    exporter = FakeDcgm(lambda: nodes, lambda: pods, utilization)
    text = exporter.render()
    assert text.count('DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="') == 16  # every GPU of both nodes
    assert f'modelName="{GPU_MODEL.replace("-", " ")}"' in text
    samples = samples_from_text(text)
    assert sorted(samples) == ["team-a/busy-0", "team-a/busy-1", "team-b/idle-0", "team-c/other-0"]
    assert [len(samples[k]) for k in sorted(samples)] == [4, 4, 2, 1]
    assert all(0.76 <= v <= 0.84 for v in samples["team-a/busy-0"] + samples["team-a/busy-1"])
    assert all(v <= 0.05 for v in samples["team-b/idle-0"]) and samples["team-c/other-0"] == [0.0]
    assert exporter.render() == text  # the same cluster, the same answer


def test_the_demo_workload_has_busy_and_idle_gangs_the_same_for_a_seed():
    """Most training gangs keep their GPUs 70-95 % busy and some sit idle (<= 5 %), identically for one seed."""
    rng = random.Random(7)
    specs = [next_gang(rng, n) for n in range(300)]
    first = [gpu_profile(1, s) for s in specs]
    assert first == [gpu_profile(1, s) for s in specs]
    training = [p for s, p in zip(specs, first, strict=True) if s.kind in ("training", "large")]
    idle = [p for p in training if p <= 0.05]
    assert 0 < len(idle) < len(training) / 3
    assert all(0.70 <= p <= 0.95 for p in training if p > 0.05)


def test_the_closing_hints_name_a_muster_this_shell_can_run(tmp_path, monkeypatch, capsys):
    """Without the venv on PATH (as after `make demo`), the hints say `.venv/bin/muster`, not a bare `muster`."""
    import sys
    from pathlib import Path

    from muster.demo.cli import print_summary
    from muster.demo.harness import DemoResult

    venv_bin = Path(sys.executable).parent
    monkeypatch.chdir(venv_bin.parent.parent)
    monkeypatch.setenv("PATH", str(tmp_path))  # no muster anywhere on it
    result = DemoResult(url="nats://127.0.0.1:4222", port=4222, store_dir=tmp_path, stream="MUSTER", events=1)
    print_summary(result, tmp_path)
    hints = [line.strip() for line in capsys.readouterr().out.splitlines() if "replay --nats" in line]
    assert hints == [
        f"{venv_bin.relative_to(venv_bin.parent.parent)}/muster replay --nats {result.url} --stream MUSTER --running"
    ]
    monkeypatch.setenv("PATH", str(venv_bin))  # muster on PATH: the short name works
    print_summary(result, tmp_path)
    assert "  muster replay --nats" in capsys.readouterr().out


def test_the_live_view_counts_the_gpus_held_on_flavors():
    """The header's "cluster used/capacity" counts a job admitted on a flavor (it read plain `gpu` only: 0)."""
    from rich.console import Console

    from muster.demo.view import DemoStats, render
    from muster.events.types import (
        FlavorConfigured,
        FlavorQuota,
        JobAdmitted,
        JobSubmitted,
        NodeAdded,
        PodSet,
        QueueConfigured,
        ResourceGroup,
    )
    from muster.projections.cluster import fold

    state = fold(
        [
            FlavorConfigured(at=0, name="h100", node_labels={"model": "h100"}),
            NodeAdded(at=0, node="n0", labels={"model": "h100"}, capacity={"gpu": 8}),
            NodeAdded(at=0, node="n1", labels={"model": "h100"}, capacity={"gpu": 8}),
            QueueConfigured(
                at=0,
                name="team-a",
                resource_groups=[
                    ResourceGroup(covered=["gpu"], flavors=[FlavorQuota(name="h100", nominal={"gpu": 16})])
                ],
            ),
            JobSubmitted(at=1, job="j", queue="team-a", podsets=[PodSet(name="w", count=1, requests={"gpu": 8})]),
            JobAdmitted(at=1, job="j", queue="team-a", placement={"w-0": "n0"}, flavors={"w": {"gpu": "h100"}}),
        ]
    )
    assert state.jobs["j"].status == "admitted"
    console = Console(record=True, width=120)
    console.print(render(state, DemoStats(), elapsed=1, duration=10, speed=1))
    assert "cluster     8/16 GPUs" in console.export_text()


@pytest.mark.slow
def test_the_last_frame_is_the_log_as_it_ends(tmp_path):
    """The demo's last frame counts every event of its log (it lagged: facts and submissions landed after the
    daemon stopped folding, so its queues disagreed with `muster queues` on the same log)."""
    proc = subprocess.run(
        [MUSTER, "demo", "--duration", "8", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = int(re.search(r"([\d,]+) events on stream MUSTER", proc.stdout).group(1).replace(",", ""))  # type: ignore[union-attr]
    shown = re.findall(r"log\s+([\d,]+) events", proc.stdout)
    assert shown and int(shown[-1].replace(",", "")) == events


@pytest.mark.parametrize("view", [[], ["--no-live"], ["--no-ui"]], ids=["live-and-dashboard", "no-live", "no-ui"])
def test_the_demo_into_a_closed_pipe_ends_quietly_as_every_command_does(tmp_path, view):
    """`muster demo | head` whose reader has gone ends silently with 141, as `muster jobs | head` does (it was exit
    1, rich's own, with a traceback when the dashboard's line hit the pipe), and leaves no demo folder locked."""
    from pipekit import run_into_closed_pipe

    from muster.cli import SIGPIPE_STATUS

    argv = ["demo", "--duration", "3", "--dir", str(tmp_path / "demo"), "--ui-port", "0", *view]
    done = run_into_closed_pipe(argv)
    assert (done.returncode, done.stderr) == (SIGPIPE_STATUS, "")
    # the demo stopped its nats-server: a second demo in the same folder runs
    again = subprocess.run([MUSTER, *argv[:2], "1", *argv[3:]], capture_output=True, text=True, timeout=90)
    assert again.returncode == 0, again.stderr[-2000:]

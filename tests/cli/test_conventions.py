"""One set of conventions for every `muster` command: `--help`, exit codes, and NATS that does not answer.

Exit status everywhere: 0 success, 1 a runtime failure (NATS not answering), 2 usage or invalid
input (a bad flag, a URL that is no NATS URL). A refused NATS fails within 2 s naming the URL.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

from muster.cli import build_parser, main
from muster.events.embedded import free_port


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [path]
    out: list[tuple[str, ...]] = []
    for name, child in subs[0].choices.items():
        out += _leaves(child, (*path, name))
    return out


COMMANDS = _leaves(build_parser())


def test_the_walk_finds_every_command() -> None:
    """Every top-level command and the subcommands of `queues` and `billing` are walked below."""
    assert {c[0] for c in COMMANDS} >= {"sim", "submit", "replay", "audit", "daemon", "demo", "snapshot", "whatif"}
    assert ("queues", "apply") in COMMANDS and ("billing", "run") in COMMANDS and ("billing", "report") in COMMANDS


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_and_exits_2_on_a_bad_flag(command: tuple[str, ...], capsys) -> None:
    """`--help` prints a usage and exits 0; an unknown flag exits 2 with the usage and an error line."""
    with pytest.raises(SystemExit) as helped:
        main([*command, "--help"])
    assert helped.value.code == 0 and "usage: muster " + " ".join(command) in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        main([*command, "--no-such-flag"])
    assert bad.value.code == 2 and f"muster {' '.join(command)}: error: " in capsys.readouterr().err


def _nats_commands(tmp_path: Path) -> list[list[str]]:
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - {name: q, nominal: {gpu: 8}}\n")
    return [
        ["submit", "--queue", "q"],
        ["queues", "apply", str(queues)],
        ["billing", "run", "--once", "--db", f"sqlite:///{tmp_path / 'ledger.db'}"],
        ["replay"],
        ["explain", "some-job"],
        ["audit"],
        ["whatif", "--queues", str(queues)],
        ["snapshot"],
    ]


NATS_COMMANDS = ["submit", "queues apply", "billing run", "replay", "explain", "audit", "whatif", "snapshot"]


@pytest.mark.parametrize("index", range(len(NATS_COMMANDS)), ids=NATS_COMMANDS)
def test_a_refused_nats_fails_within_2s_naming_the_url(index: int, tmp_path: Path, capsys) -> None:
    """Every command that reads or writes the log exits 1 within 2 s when nothing listens, with the URL."""
    url = f"nats://127.0.0.1:{free_port()}"
    argv = _nats_commands(tmp_path)[index]
    t0 = time.monotonic()
    code = main([*argv, "--nats", url])
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("muster ") and url in last
    assert elapsed < 2.0, f"{' '.join(argv)} took {elapsed:.1f} s"


@pytest.mark.parametrize("index", range(len(NATS_COMMANDS)), ids=NATS_COMMANDS)
def test_an_http_url_is_refused_as_no_nats_url(index: int, tmp_path: Path, capsys) -> None:
    """`--nats http://...` exits 2 saying it is no NATS URL and what to write instead."""
    argv = _nats_commands(tmp_path)[index]
    assert main([*argv, "--nats", "http://localhost:4222"]) == 2
    err = capsys.readouterr().err
    assert "http://localhost:4222 is not a NATS URL" in err and "nats://localhost:4222" in err


def test_make_bench_runs_every_benchmark_at_modest_sizes() -> None:
    """bench/run_all.py (`make bench`) lists every runnable script of bench/, each with small arguments."""
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[2] / "bench"
    listed = subprocess.run(
        [sys.executable, str(bench / "run_all.py"), "--list"], capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    runnable = (p for p in bench.glob("*.py") if p.name != "run_all.py" and "__main__" in p.read_text())
    scripts = sorted(p.name for p in runnable)  # modules the scripts share (kubereal.py) run nothing
    assert sorted(line.split()[1].removeprefix("bench/") for line in listed) == scripts
    assert all(len(line.split()) > 2 for line in listed), "every script gets modest arguments"


def test_version_prints_the_installed_version(capsys) -> None:
    """`muster --version` prints the version of the installed package and exits 0."""
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"muster {version('muster-scheduler')}"

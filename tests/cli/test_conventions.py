"""One set of conventions for every `muster` command: `--help`, exit codes, and NATS that does not answer.

Exit status everywhere: 0 success, 1 a runtime failure (NATS not answering), 2 usage or invalid
input (a bad flag, a URL that is no NATS URL), 141 (silent) when the reader of the output has gone.
A refused NATS fails within 2 s naming the URL.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from muster.cli import build_parser, main
from muster.events.embedded import free_port


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every runnable command: a parser without subcommands, or one whose subcommand is optional."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [path]
    out: list[tuple[str, ...]] = [path] if path and not subs[0].required else []
    for name, child in subs[0].choices.items():
        out += _leaves(child, (*path, name))
    return out


COMMANDS = _leaves(build_parser())


def test_the_walk_finds_every_command() -> None:
    """Every top-level command and the subcommands of `queues` and `billing` are walked below."""
    assert {c[0] for c in COMMANDS} >= {"sim", "submit", "replay", "audit", "daemon", "demo", "snapshot", "whatif"}
    assert {c[0] for c in COMMANDS} >= {"jobs", "cancel", "hold", "release", "completion"}
    assert ("queues",) in COMMANDS and ("queues", "apply") in COMMANDS
    assert ("billing", "run") in COMMANDS and ("billing", "report") in COMMANDS


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
        ["jobs"],
        ["queues"],
        ["cancel", "some-job"],
        ["hold", "some-job"],
        ["release", "some-job"],
        ["ui", "--port", "0"],
    ]


NATS_COMMANDS = [
    *("submit", "queues apply", "billing run", "replay", "explain", "audit", "whatif", "snapshot"),
    *("jobs", "queues", "cancel", "hold", "release", "ui"),
]


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


@pytest.fixture
def silent_nats() -> Any:
    """The URL of a server that takes TCP connections and never says a word (a hung or wrong host)."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"nats://127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["jobs"], id="jobs-reads"),
        pytest.param(["hold", "some-job", "--connect-timeout", "1"], id="hold-appends"),
    ],
)
def test_a_nats_that_does_not_answer_fails_naming_the_url_and_the_wait(argv: list[str], silent_nats: str) -> None:
    """A server that takes the connection and stays silent ends the command: exit 1, its URL, how long it waited."""
    import subprocess
    import sys

    # a process of its own, as a user runs it: the connection given up on is the process's to drop
    done = subprocess.run(
        [sys.executable, "-m", "muster.cli", *argv, "--nats", silent_nats], capture_output=True, text=True, timeout=60
    )
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1, done.stderr
    assert silent_nats in last and "no answer" in last and "TimeoutError" not in last, last


@pytest.mark.parametrize("argv", [["jobs"], ["hold", "some-job"]], ids=["jobs-reads", "hold-appends"])
def test_a_stream_that_is_not_there_is_named_with_who_makes_it(argv: list[str], nats_url: str, capsys) -> None:
    """A mistyped `--stream` exits non-zero saying that stream does not exist and what makes one, in plain words."""
    code = main([*argv, "--nats", nats_url, "--stream", "NO_SUCH_STREAM"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code != 0
    assert "stream NO_SUCH_STREAM does not exist on this server" in last and "create=" not in last, last


@pytest.mark.parametrize("index", range(len(NATS_COMMANDS)), ids=NATS_COMMANDS)
def test_every_command_on_nats_takes_creds_and_tls_flags(index: int, tmp_path: Path, capsys) -> None:
    """Readers and appenders alike take `--creds` and `--tls-*`: an unreadable one exits 2 naming it, before NATS."""
    argv = _nats_commands(tmp_path)[index]
    url = f"nats://127.0.0.1:{free_port()}"
    missing = tmp_path / "team-a.creds"
    assert main([*argv, "--nats", url, "--creds", str(missing)]) == 2
    assert f"--creds {missing}" in capsys.readouterr().err
    assert main([*argv, "--nats", url, "--tls-ca", str(tmp_path / "ca.pem")]) == 2
    assert "ca.pem" in capsys.readouterr().err
    assert main([*argv, "--nats", url, "--tls-key", str(tmp_path / "client.key")]) == 2
    assert "--tls-key goes with --tls-cert" in capsys.readouterr().err


@pytest.mark.parametrize("index", range(len(NATS_COMMANDS)), ids=NATS_COMMANDS)
def test_every_command_on_nats_reads_a_config_nats_block_alike(index: int, tmp_path: Path, capsys) -> None:
    """A `--config` whose nats.auth names a password file that is not there exits 2 naming it, before NATS."""
    argv = _nats_commands(tmp_path)[index]
    (tmp_path / "username").write_text("team-a")
    missing = tmp_path / "password"
    auth = {"username_file": str(tmp_path / "username"), "password_file": str(missing)}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"nats": {"url": f"nats://127.0.0.1:{free_port()}", "auth": auth}}))
    assert main([*argv, "--config", str(config)]) == 2
    assert f"cannot read {missing}" in capsys.readouterr().err


@pytest.mark.parametrize("index", range(len(NATS_COMMANDS)), ids=NATS_COMMANDS)
def test_every_command_on_nats_refuses_a_config_that_is_no_yaml_mapping(index: int, tmp_path: Path, capsys) -> None:
    """A `--config` that is not YAML, or not a mapping, exits 2 naming the file (and the line), before NATS."""
    argv = _nats_commands(tmp_path)[index]
    config = tmp_path / "config.yaml"
    for text, why in (("nats: [unclosed\n", ":2: malformed YAML"), ("- a list\n", ": expected a mapping at the top")):
        config.write_text(text)
        assert main([*argv, "--config", str(config)]) == 2
        assert f"{config}{why}" in capsys.readouterr().err


MALFORMED = "a: 1\nb: [x\nc: 2\n"
"""YAML whose parser stops at line 3."""


def _file_readers(bad: Path) -> dict[str, list[str]]:
    """Every command that reads a YAML file of its user's, given `bad` as that file."""
    return {
        "daemon --config": ["daemon", "--config", str(bad)],
        "sim": ["sim", str(bad)],
        "queues apply": ["queues", "apply", str(bad), "--nats", f"nats://127.0.0.1:{free_port()}"],
        "submit --file": ["submit", "--file", str(bad), "--nats", f"nats://127.0.0.1:{free_port()}"],
        "whatif --queues": ["whatif", "--queues", str(bad), "--log", str(bad.parent / "log.jsonl")],
        "billing run --config": ["billing", "run", "--config", str(bad)],
        "billing report --rates": [
            "billing",
            "report",
            "--rates",
            str(bad),
            "--db",
            f"sqlite:///{bad.parent / 'l.db'}",
        ],
        "ui --rates": ["ui", "--rates", str(bad), "--log", str(bad.parent / "log.jsonl")],
    }


@pytest.mark.parametrize("reader", list(_file_readers(Path("x"))))
def test_every_yaml_file_a_command_reads_is_refused_at_its_file_and_line(reader: str, tmp_path: Path, capsys) -> None:
    """Malformed YAML in any file a user hands a command (config, scenario, queues, job, rate card) exits 2 with
    `FILE:LINE: malformed YAML: ...`, the line where the parser stopped (several printed PyYAML's multi-line
    report, or no line at all)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(MALFORMED)
    (tmp_path / "log.jsonl").write_text("")
    assert main(_file_readers(bad)[reader]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: malformed YAML: expected ',' or ']'" in err
    assert len(err.strip().splitlines()) == 1, err


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


def test_the_readme_names_only_commands_and_flags_that_exist() -> None:
    """Each `muster ...` span of README.md is a command with flags it takes, and every command is in one."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    spans = re.findall(r"`(muster [^`]+)`", readme)
    assert {c[0] for c in COMMANDS} <= {span.split()[1] for span in spans}
    wrong = []
    for span in spans:
        parser, words = build_parser(), span.split()[1:]
        while words and (child := _subcommand(parser, words[0])) is not None:
            parser, words = child, words[1:]
        taken = {flag for action in parser._actions for flag in action.option_strings}
        for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)(\*?)", span):
            name, glob = flag
            if not (name in taken or (glob and any(t.startswith(name) for t in taken))):
                wrong.append(f"{span}: {name}{glob}")
    assert not wrong


def test_the_readme_names_every_command_and_subcommand() -> None:
    """Every runnable command, subcommands too (`queues apply`, `billing report`), is in a `muster ...` span of
    README.md, so the README's command line section lists all that `muster --help` does."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    spans = {" ".join(span.split()[1:3]) for span in re.findall(r"`(muster [^`]+)`", readme)}
    spans |= {span.split()[0] for span in spans}
    assert [" ".join(c) for c in COMMANDS if " ".join(c) not in spans] == []


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_commands_help_says_what_it_and_each_option_does(command: tuple[str, ...]) -> None:
    """`muster ... --help` has a description line and a help text for every option and argument (`--by` of
    `billing report` had none, nor `billing run`/`report` and `queues apply` a description)."""
    parser = build_parser()
    for name in command:
        parser = _subcommand(parser, name) or parser
    assert parser.description, f"muster {' '.join(command)} --help has no description"
    silent = [a.option_strings or a.dest for a in parser._actions if a.help is None]
    assert silent == []


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            child: argparse.ArgumentParser = action.choices[name]
            return child
    return None


def test_version_prints_the_installed_version_and_which_core_runs(capsys) -> None:
    """`muster --version` prints the installed package's version and whether the core runs compiled, and exits 0."""
    from importlib.metadata import version

    from muster.projections import CORE

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"muster {version('muster-scheduler')}, core: {CORE}"
    assert CORE == "compiled (mypyc)" or CORE.startswith("Python (")


QUIET = {("daemon",), ("demo",), ("billing", "run"), ("completion",), ("ui",)}
"""Commands that print no data: long-running services (the dashboard serves pages), and the completion script."""


@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in QUIET], ids=" ".join)
def test_every_command_that_prints_data_takes_o_table_json_jsonl(command: tuple[str, ...]) -> None:
    """`-o`/`--output` is there on every command that prints data, with at least table, json and jsonl."""
    parser = build_parser()
    for name in command:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    output = next((a for a in parser._actions if "--output" in a.option_strings), None)
    assert output is not None and "-o" in output.option_strings, f"muster {' '.join(command)} has no -o/--output"
    assert {"table", "json", "jsonl"} <= set(output.choices or ())


def _file_commands(tmp_path: Path) -> list[list[str]]:
    """Each command that reads a log, on a sim log file (the same answers as on a stream)."""
    from muster.events.codec import encode
    from muster.replay.scenario import load
    from muster.replay.simulator import simulate

    scenario = Path(__file__).resolve().parents[2] / "examples" / "deadlock.yaml"
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"".join(encode(e) + b"\n" for e in simulate(load(str(scenario))).events))
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - {name: team-a, nominal: {gpu: 128}}\n")
    snaps = tmp_path / "snaps"
    flags = ["--log", str(log)]
    return [
        ["sim", str(scenario)],
        ["replay", *flags],
        ["explain", "big-2", *flags],
        ["audit", *flags],
        ["whatif", "--queues", str(queues), *flags],
        ["jobs", "--all", *flags],
        ["queues", *flags],
        ["snapshot", "--snapshots", str(snaps), *flags],
    ]


FILE_COMMANDS = ["sim", "replay", "explain", "audit", "whatif", "jobs", "queues", "snapshot"]


@pytest.mark.parametrize("index", range(len(FILE_COMMANDS)), ids=FILE_COMMANDS)
def test_o_json_is_one_document_and_o_jsonl_one_object_per_line(index: int, tmp_path: Path, capsys) -> None:
    """`-o json` prints one JSON document and `-o jsonl` lines that each parse as a JSON object."""
    import json

    argv = _file_commands(tmp_path)[index]
    capsys.readouterr()
    assert main([*argv, "-o", "json"]) == 0
    json.loads(capsys.readouterr().out)
    assert main([*argv, "-o", "jsonl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(isinstance(json.loads(line), dict) for line in lines)


@pytest.mark.parametrize("index", range(1, len(FILE_COMMANDS)), ids=FILE_COMMANDS[1:])
@pytest.mark.parametrize("flag", ["--nats", "--stream", "--subject-prefix"])
def test_a_log_file_and_a_stream_at_once_are_refused(index: int, flag: str, tmp_path: Path, capsys) -> None:
    """`--log FILE` with a stream's flag names two logs: exit 2 saying so, not an answer from the file alone."""
    argv = _file_commands(tmp_path)[index]
    capsys.readouterr()
    assert main([*argv, flag, "nats://127.0.0.1:4222" if flag == "--nats" else "OTHER"]) == 2
    assert f"--log names a file and {flag} a stream: give one log" in capsys.readouterr().err


def test_completion_script_completes_commands_options_and_choices(tmp_path: Path, capsys) -> None:
    """`muster completion bash`, sourced in bash, completes a command, a subcommand, options and -o's values."""
    import shutil
    import subprocess

    assert main(["completion", "bash"]) == 0
    script = tmp_path / "muster.bash"
    script.write_text(capsys.readouterr().out)
    bash = shutil.which("bash")
    assert bash is not None

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        probe = f'source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _muster; echo "${{COMPREPLY[@]}}"'
        done = subprocess.run([bash, "-c", probe], capture_output=True, text=True, timeout=30, check=True)
        return done.stdout.split()

    assert complete("muster", "jo") == ["jobs"]
    assert complete("muster", "queues", "ap") == ["apply"]
    assert "--dry-run" in complete("muster", "queues", "apply", "--")
    assert complete("muster", "jobs", "-o", "") == ["table", "wide", "json", "jsonl"]
    assert complete("muster", "billing", "report", "--by", "") == ["queue", "job", "team", "flavor"]


def _ledger(tmp_path: Path) -> str:
    """A billing ledger of the deadlock example's sim log, written the way `billing run` writes it."""
    from muster.daemon.billing_store import LedgerDB
    from muster.projections.billing import fold_billing
    from muster.replay.scenario import load
    from muster.replay.simulator import simulate

    scenario = Path(__file__).resolve().parents[2] / "examples" / "deadlock.yaml"
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    state = fold_billing(enumerate(simulate(load(str(scenario))).events, start=1))
    with LedgerDB.open(url) as db:
        db.load()
        db.commit(state.ledger, state.tracker)
    return url


@pytest.mark.parametrize("output", ["table", "jsonl"])
@pytest.mark.parametrize("index", range(len(FILE_COMMANDS) + 1), ids=[*FILE_COMMANDS, "billing report"])
def test_a_command_whose_reader_closed_the_pipe_exits_quietly_as_git_log_does(
    index: int, output: str, tmp_path: Path
) -> None:
    """`muster COMMAND | head` whose reader has gone ends silently with 141, the status of `git log | head`
    (a rich table's end was exit 1, rich's own; the others' 0)."""
    from pipekit import run_into_closed_pipe

    from muster.cli import SIGPIPE_STATUS

    commands = [*_file_commands(tmp_path), ["billing", "report", "--db", _ledger(tmp_path)]]
    done = run_into_closed_pipe([*commands[index], "-o", output])
    assert (done.returncode, done.stderr) == (SIGPIPE_STATUS, "")

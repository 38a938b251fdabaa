"""Running `muster` into a pipe whose reader has gone, as `muster jobs | head` leaves it once head has read."""

from __future__ import annotations

import os
import subprocess
import sys


def run_into_closed_pipe(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`muster ARGV` with stdout a pipe whose read end is closed before it starts: every write of it fails,
    whatever the output's size and the timing (a real `| head` fails only the writes after head exits)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "muster.cli", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)

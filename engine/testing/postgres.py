"""A throwaway PostgreSQL cluster for tests, from Debian's server binaries.

The pytest plugin's ``postgres_dsn`` (session-scoped, ``engine.testing.pytest_plugin``) yields
``EPOCHLINE_TEST_POSTGRES_DSN`` when set. Otherwise it initialises a cluster in a fresh temporary directory,
starts it on 127.0.0.1 on a free port (unix socket in the same directory), yields its DSN and stops it with
``pg_ctl stop`` on its own data directory at the end, then removes the directory. When no server binaries
are installed the tests that need it are skipped with a reason that says how to install them
(``bash .ci/postgres.sh``) — never silently.

The cluster allows ``max_prepared_transactions`` (20 by default): the PostgreSQL sink commits each epoch by
``PREPARE TRANSACTION``. A test of the sink's refusal of a server without them starts one with 0.

The cluster's default collation is ICU ``en-US``, a locale collation under which ``"a" < "B"``, so a key
column that forgot ``COLLATE "C"`` would order keys differently from SQLite and fail the key order test.

initdb and postgres refuse to run as root, so as root the server commands run as the ``postgres`` OS user
(``runuser``) in a directory that user owns.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine.ports import free_port

DSN_VARIABLE = "EPOCHLINE_TEST_POSTGRES_DSN"
SERVER_USER = "postgres"
START_TIMEOUT_SECONDS = 60
DEFAULT_PREPARED_TRANSACTIONS = 20


class PostgresUnavailable(RuntimeError):
    """The throwaway cluster could not be initialised or started; the message carries the server log."""


def postgres_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` that has ``initdb`` (Debian's layout), or None."""
    candidates = [path.parent for path in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    numbered = [path for path in candidates if path.parent.name.isdigit()]
    return max(numbered, key=lambda path: int(path.parent.name), default=None)


class ThrowawayPostgres:
    """One PostgreSQL cluster in its own temporary directory, listening on 127.0.0.1:``port``."""

    def __init__(self, bin_dir: Path, max_prepared_transactions: int = DEFAULT_PREPARED_TRANSACTIONS) -> None:
        self.bin_dir = bin_dir
        self.max_prepared_transactions = max_prepared_transactions
        self._as_server_user: list[str] = []
        owner = None
        if os.geteuid() == 0:
            self._as_server_user = ["runuser", "-u", SERVER_USER, "--"]
            try:
                owner = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root, the server must run as the {SERVER_USER!r} OS user, which does not exist "
                    "(Debian's postgresql package creates it: bash .ci/postgres.sh)"
                ) from None
        self.root = Path(tempfile.mkdtemp(prefix="epochline-postgres-"))
        if owner is not None:
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self.data_dir = self.root / "data"
        self.log_file = self.root / "server.log"
        self.port = free_port()

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        command = [*self._as_server_user, str(self.bin_dir / tool), *args]
        result = subprocess.run(command, check=False, capture_output=True, text=True,
                                timeout=START_TIMEOUT_SECONDS + 30)
        if result.returncode != 0:
            raise PostgresUnavailable(
                f"{tool} failed (exit {result.returncode}) for cluster {self.data_dir}:\n"
                f"{result.stdout}{result.stderr}{self._server_log()}"
            )

    def _server_log(self) -> str:
        return self.log_file.read_text(errors="replace")[-4000:] if self.log_file.exists() else ""

    def start(self) -> None:
        self._run(
            "initdb", "--pgdata", str(self.data_dir), "--username", "postgres", "--auth", "trust",
            "--encoding", "UTF8", "--locale", "C.UTF-8", "--locale-provider", "icu", "--icu-locale", "en-US",
            "--no-sync",
        )
        server_options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                          f"-c max_prepared_transactions={self.max_prepared_transactions}")
        self._run(
            "pg_ctl", "start", "--pgdata", str(self.data_dir), "--log", str(self.log_file),
            "--options", server_options, "--wait", "--timeout", str(START_TIMEOUT_SECONDS),
        )

    def stop(self) -> None:
        """Stop the server through its own data directory's PID file, then delete the directory."""
        try:
            if (self.data_dir / "postmaster.pid").exists():
                self._run("pg_ctl", "stop", "--pgdata", str(self.data_dir), "--mode", "fast", "--wait")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def no_postgres_reason() -> str:
    return ("PostgreSQL server binaries not found under /usr/lib/postgresql/<version>/bin: install Debian's "
            f"postgresql package (bash .ci/postgres.sh) or set {DSN_VARIABLE} to run the PostgreSQL tests")


@contextmanager
def throwaway_postgres(max_prepared_transactions: int = DEFAULT_PREPARED_TRANSACTIONS) -> Iterator[ThrowawayPostgres]:
    """A started throwaway cluster, stopped (by its own data directory) on leaving; the test is skipped with
    how to install them when Debian's server binaries are missing."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip(no_postgres_reason())
    server = ThrowawayPostgres(bin_dir, max_prepared_transactions)
    try:
        server.start()
        yield server
    finally:
        server.stop()

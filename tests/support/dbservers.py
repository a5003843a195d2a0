"""Private database servers for tests: MariaDB and PostgreSQL on a data directory and port of their own.

A test that needs to stop, restart or misuse a server (tests/chaos) starts one of these
instead of touching the shared servers on 127.0.0.1:3306/5432 that the other suites use::

    with MariaDBServer() as server:           # initialised in a temporary directory, started
        server.create_database("app")
        url = server.url("app")              # mysql://root@127.0.0.1:<port>/app
        server.stop(); server.start()        # same data directory, same port
        server.kill_connections(user="w1")   # KILL CONNECTION of every session of a user

No Django here (the servers are plain subprocesses and driver connections), so the module
works in any process. Needs the server binaries (Debian's mariadb-server, postgresql) and,
as root, runs each server as its system user (``mysql``, ``postgres``).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from .ports import free_port

MARIADBD = "/usr/sbin/mariadbd"


def postgres_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` that has ``initdb`` and ``pg_ctl``."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def missing() -> dict[str, str]:
    """Why each kind of server cannot be started here (kind -> reason); empty when both can."""
    reasons: dict[str, str] = {}
    as_root = os.geteuid() == 0
    if not (os.access(MARIADBD, os.X_OK) and shutil.which("mariadb-install-db")):
        reasons["mariadb"] = f"{MARIADBD} or mariadb-install-db not installed (apt-get install mariadb-server)"
    if postgres_bin_dir() is None:
        reasons["postgresql"] = "no /usr/lib/postgresql/*/bin/initdb (apt-get install postgresql)"
    for kind, user in (("mariadb", "mysql"), ("postgresql", "postgres")):
        if kind not in reasons and as_root:
            try:
                pwd.getpwnam(user)
            except KeyError:
                reasons[kind] = f"no system user {user!r} to run the server as"
    return reasons


class DatabaseServer:
    """A server process on a private data directory and port; start/stop/restart keep both.

    Subclasses know how to initialise, start, stop, connect as the superuser and list or
    kill sessions. ``start()``/``stop()`` may be called any number of times; ``cleanup()``
    stops the server and removes the directory.
    """

    kind = ""
    scheme = ""
    #: The system user the server runs as when we are root.
    system_user = ""
    #: The account ``connect()`` and ``url()`` use by default.
    superuser = ""

    def __init__(self, base_dir: str | None = None) -> None:
        self.base = Path(tempfile.mkdtemp(prefix=f"sqlqueue-{self.kind}-", dir=base_dir))
        self.data_dir = self.base / "data"
        self.log_file = self.base / "server.log"
        self.port = free_port()
        if os.geteuid() == 0:
            entry = pwd.getpwnam(self.system_user)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
        self.initialise()

    # -- lifecycle --------------------------------------------------------------------------

    def initialise(self) -> None:
        raise NotImplementedError

    def start(self, timeout: float = 60) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 60) -> None:
        raise NotImplementedError

    def running(self) -> bool:
        raise NotImplementedError

    def restart(self, down: float = 0.0) -> float:
        """Stop, stay down ``down`` seconds, start again; return the monotonic time it was up again."""
        self.stop()
        time.sleep(down)
        self.start()
        return time.monotonic()

    def cleanup(self) -> None:
        try:
            if self.running():
                self.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> DatabaseServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.execute("SELECT 1")
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.kind} on port {self.port} not ready after {timeout}s: {exc}\n{self.log_tail()}"
                    ) from exc
                time.sleep(0.1)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # -- SQL as the superuser ---------------------------------------------------------------

    def connect(self, database: str | None = None) -> Any:
        raise NotImplementedError

    def execute(self, sql: str, params: tuple[Any, ...] = (), database: str | None = None) -> list[tuple[Any, ...]]:
        """Run one statement on a fresh superuser connection (autocommit) and return its rows."""
        conn = self.connect(database)
        try:
            cursor = conn.cursor()
            cursor.execute(sql, params or None)
            rows = list(cursor.fetchall()) if cursor.description else []
            cursor.close()
            return rows
        finally:
            conn.close()

    def url(self, database: str, user: str | None = None, password: str = "") -> str:
        """A DATABASE_URL (django-environ syntax) for ``database`` as ``user`` (the superuser by default)."""
        user = user or self.superuser
        auth = f"{user}:{password}" if password else user
        return f"{self.scheme}://{auth}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        raise NotImplementedError

    def create_user(self, name: str, password: str) -> None:
        """A login with every privilege (a throwaway server: the test decides who may do what)."""
        raise NotImplementedError

    def sessions(self, user: str) -> list[int]:
        """Server-side ids of the client sessions logged in as ``user``."""
        raise NotImplementedError

    def kill_session(self, session_id: int) -> bool:
        """Kill one client session from the server side; False if it was already gone."""
        raise NotImplementedError

    def kill_connections(self, user: str) -> list[int]:
        """Kill every session of ``user``; return the ids killed."""
        return [sid for sid in self.sessions(user) if self.kill_session(sid)]


class MariaDBServer(DatabaseServer):
    """``mariadbd`` on its own data directory, socket and TCP port (127.0.0.1 only)."""

    kind = "mariadb"
    scheme = "mysql"
    system_user = "mysql"
    superuser = "root"

    def __init__(self, base_dir: str | None = None) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        super().__init__(base_dir)

    def _user_args(self) -> list[str]:
        return ["--user=mysql"] if os.geteuid() == 0 else []

    def initialise(self) -> None:
        with open(self.base / "install.log", "wb") as log:
            subprocess.run(
                [
                    "mariadb-install-db",
                    "--no-defaults",
                    f"--datadir={self.data_dir}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    *self._user_args(),
                ],
                check=True,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def start(self, timeout: float = 60) -> None:
        if self.running():
            return
        self.proc = subprocess.Popen(
            [
                MARIADBD,
                "--no-defaults",
                f"--datadir={self.data_dir}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.base / 'mysqld.sock'}",
                f"--pid-file={self.base / 'mariadbd.pid'}",
                f"--log-error={self.log_file}",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                "--max-connections=300",
                "--skip-log-bin",
                *self._user_args(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C of the test run does not reach the server first
        )
        try:
            self.wait_ready(timeout)
        except Exception:
            self.stop()
            raise

    def stop(self, timeout: float = 60) -> None:
        """Shut down as ``mysqladmin shutdown`` would (SIGTERM: connections closed, InnoDB flushed)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def connect(self, database: str | None = None) -> Any:
        import MySQLdb

        kwargs: dict[str, Any] = {"unix_socket": str(self.base / "mysqld.sock"), "user": "root", "connect_timeout": 5}
        if database:
            kwargs["database"] = database
        conn = MySQLdb.connect(**kwargs)
        conn.autocommit(True)
        return conn

    def create_database(self, name: str) -> None:
        self.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")

    def create_user(self, name: str, password: str) -> None:
        self.execute(f"CREATE USER '{name}'@'127.0.0.1' IDENTIFIED BY %s", (password,))
        self.execute(f"GRANT ALL PRIVILEGES ON *.* TO '{name}'@'127.0.0.1'")

    def sessions(self, user: str) -> list[int]:
        rows = self.execute(
            "SELECT id FROM information_schema.processlist WHERE user = %s AND command <> 'Killed'", (user,)
        )
        return [int(row[0]) for row in rows]

    def kill_session(self, session_id: int) -> bool:
        import MySQLdb

        try:
            self.execute(f"KILL CONNECTION {int(session_id)}")
            return True
        except MySQLdb.OperationalError as exc:  # 1094: unknown thread id (it ended meanwhile)
            if exc.args and exc.args[0] == 1094:
                return False
            raise


class PostgresServer(DatabaseServer):
    """PostgreSQL (``initdb``, ``pg_ctl``) on its own data directory, socket directory and TCP port."""

    kind = "postgresql"
    scheme = "postgres"
    system_user = "postgres"
    superuser = "postgres"

    def __init__(self, base_dir: str | None = None) -> None:
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL's server binaries are not installed")
        self.bin_dir = bin_dir
        super().__init__(base_dir)

    def _run(self, *command: str, timeout: float = 120) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        result = subprocess.run(
            [*prefix, *command], capture_output=True, text=True, timeout=timeout, cwd=self.base, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}")

    def initialise(self) -> None:
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )

    def start(self, timeout: float = 60) -> None:
        if self.running():
            return
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "start",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_file),
            "-o",
            options,
            "-w",
            "-t",
            str(int(timeout)),
            timeout=timeout + 10,
        )
        self.wait_ready(timeout)

    def stop(self, timeout: float = 60) -> None:
        """``pg_ctl stop -m fast``: sessions terminated, a checkpoint, a clean shutdown."""
        if not self.running():
            return
        self._run(str(self.bin_dir / "pg_ctl"), "stop", "-D", str(self.data_dir), "-m", "fast", "-w", timeout=timeout)

    def running(self) -> bool:
        return (self.data_dir / "postmaster.pid").exists()

    def connect(self, database: str | None = None) -> Any:
        import psycopg

        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            dbname=database or "postgres",
            autocommit=True,
            connect_timeout=5,
        )

    def create_database(self, name: str) -> None:
        self.execute(f'CREATE DATABASE "{name}"')

    def create_user(self, name: str, password: str) -> None:
        self.execute(f"CREATE ROLE \"{name}\" LOGIN SUPERUSER PASSWORD '{password}'")

    def sessions(self, user: str) -> list[int]:
        rows = self.execute("SELECT pid FROM pg_stat_activity WHERE usename = %s AND pid <> pg_backend_pid()", (user,))
        return [int(row[0]) for row in rows]

    def kill_session(self, session_id: int) -> bool:
        rows = self.execute("SELECT pg_terminate_backend(%s)", (int(session_id),))
        return bool(rows and rows[0][0])


SERVERS: dict[str, type[DatabaseServer]] = {"mariadb": MariaDBServer, "postgresql": PostgresServer}

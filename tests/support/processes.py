"""Real ``manage.py runconsumer`` processes for tests: start, signal, kill -9, read logs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """The URL of the database the test is using (pytest-django's test database)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"  # an absolute path: sqlite:////tmp/test_x.sqlite3
    scheme, port = {"mysql": ("mysql", 3306), "postgresql": ("postgres", 5432)}[connection.vendor]
    return f"{scheme}://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or port}/{s['NAME']}"


class ConsumerProcess:
    """One ``runconsumer`` subprocess, named ``name`` (its subscriber and worker name)."""

    def __init__(
        self,
        name: str,
        *args: str,
        settings: str = "tests.support.process_settings",
        verbosity: str | None = "2",
        env: dict[str, str] | None = None,
    ) -> None:
        """``verbosity`` None: no ``-v`` on the command line; ``env`` adds to (or overrides) the environment."""
        self.name = name
        #: An exit status the test expects besides 0, 143 (SIGTERM) and -9 (kill -9).
        self.expected_status: int | None = None
        # Stays open for the life of the process; cleanup() closes and removes it.
        self.logfile = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix=f"runconsumer-{name}-", suffix=".log", delete=False
        )
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings,
            "DATABASE_URL": database_url(),
            "SQLQUEUE_TEST_WORKER": name,
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        command = [sys.executable, "manage.py", "runconsumer", "--name", name]
        if verbosity is not None:
            command += ["-v", verbosity]
        self.proc = subprocess.Popen(
            [*command, *args],
            cwd=ROOT,
            env=environment,
            stdout=self.logfile,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def terminate(self, timeout: float = 20) -> int:
        """SIGTERM (graceful drain) and wait for the exit status."""
        self.signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return Path(self.logfile.name).read_text(errors="replace")

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.logfile.close()
        os.unlink(self.logfile.name)


def wait_until(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.1,
    show: Callable[[], Any] | None = None,
) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail with ``what`` after ``timeout``.

    ``show``, if given, is called on timeout and its result put in the failure message
    (the state the condition was looking at, e.g. who holds the leases).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            state = f"; state: {show()!r}" if show is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {value!r}{state})")
        time.sleep(interval)

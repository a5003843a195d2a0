"""What every chaos run shares: a private server, workers kept running by a supervisor, and the faults.

:class:`FaultRun` starts a private MariaDB or PostgreSQL server (tests/support/dbservers.py) with
one login per worker slot (so the server side can tell the workers apart), and keeps one
``runconsumer`` per slot running under a :class:`Supervisor` (a worker that dies or exits
is started again, as systemd's ``Restart=always`` would). Its fault injectors pick a victim
at random from the run's seeded RNG:

- :meth:`FaultRun.kill9`: ``kill -9`` of a random worker;
- :meth:`FaultRun.sigstop`: ``SIGSTOP`` of a worker for ``stop_seconds`` (longer than a
  lease, so its partitions are taken over meanwhile), then ``SIGCONT``.

A run subclasses it with what its workers run (:meth:`FaultRun.spawn`), its settings module
and its own faults: tests/chaos/harness.py (nothing lost, order kept) and
tests/chaos/exactly_once.py (atomic consumers: every effect exactly once).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.dbservers import SERVERS, DatabaseServer
from tests.support.processes import ROOT, ConsumerProcess

PASSWORD = "chaos-pw"


@dataclass
class Fault:
    kind: str  # "kill -9", "SIGSTOP", "SIGSTOP in handler", "connection kill", "server restart", "hung handler"...
    at: float
    pid: int | None = None
    slot: str = ""
    #: SIGCONT (SIGSTOP), the server accepting connections again (restart).
    until: float | None = None
    detail: str = ""
    #: Filled in by the analysis: seconds until handling resumed, and how it was measured.
    recovery: float | None = None
    note: str = ""
    #: SIGSTOP: the victim's log length at SIGCONT (what it logged afterwards is checked).
    log_offset: int = 0


class Supervisor:
    """The process manager: keeps one ``runconsumer`` running per slot, restarting any that exits.

    ``spawn(slot, generation)`` starts the worker of a slot (``generation`` counts its starts).
    """

    def __init__(self, spawn: Callable[[str, int], ConsumerProcess], slots: int) -> None:
        self.spawn = spawn
        self.slots = slots
        self.current: dict[str, ConsumerProcess] = {}
        self.generation: dict[str, int] = defaultdict(int)
        self.every: list[ConsumerProcess] = []
        self.started_at: dict[int, float] = {}
        #: (slot, pid, status, monotonic time it was noticed)
        self.exits: list[tuple[str, int, int, float]] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-supervisor", daemon=True)

    def start_slot(self, slot: str) -> ConsumerProcess:
        self.generation[slot] += 1
        process = self.spawn(slot, self.generation[slot])
        self.current[slot] = process
        self.every.append(process)
        self.started_at[process.pid] = time.monotonic()
        return process

    def start(self) -> None:
        with self.lock:
            for i in range(self.slots):
                self.start_slot(f"w{i}")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            with self.lock:
                for slot, process in list(self.current.items()):
                    status = process.proc.poll()
                    if status is not None:
                        self.exits.append((slot, process.pid, status, time.monotonic()))
                        self.start_slot(slot)

    def live(self) -> list[tuple[str, ConsumerProcess]]:
        with self.lock:
            return [(slot, p) for slot, p in self.current.items() if p.alive()]

    def stop(self) -> None:
        """Stop restarting; SIGTERM every worker (SIGCONT first), kill what has not exited in 10 s."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for process in self.current.values():
            process.signal(signal.SIGCONT)
            process.signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.current.values():
            try:
                process.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.proc.kill()
                process.proc.wait(10)

    def cleanup(self) -> None:
        for process in self.every:
            process.cleanup()


class FaultRun:
    """A private server, ``workers`` supervised worker slots and the fault injectors.

    Subclasses set ``settings`` (the processes' settings module) and implement
    :meth:`spawn`. The database is ``database``; the publisher logs in as ``chaos_pub``,
    worker slot ``wN`` as ``chaos_wN``.
    """

    settings = ""
    database = "chaos"

    def __init__(self, kind: str, *, seed: int, workers: int, stop_seconds: float, log: Callable[[str], None]) -> None:
        self.kind = kind
        self.seed = seed
        self.workers = workers
        self.stop_seconds = stop_seconds
        self.rng = random.Random(seed)
        self.log = log
        self.directory = Path(tempfile.mkdtemp(prefix=f"sqlqueue-chaos-{kind}-"))
        self.server: DatabaseServer = SERVERS[kind]()
        self.supervisor = Supervisor(self.spawn, workers)
        self.faults: list[Fault] = []
        self.t0 = 0.0

    # -- setup -------------------------------------------------------------------------------

    def spawn(self, slot: str, generation: int) -> ConsumerProcess:
        raise NotImplementedError

    def env(self, user: str) -> dict[str, str]:
        return {
            "DATABASE_URL": self.server.url(self.database, user, PASSWORD),
            "CHAOS_DIR": str(self.directory),
            "DJANGO_SETTINGS_MODULE": self.settings,
        }

    def manage(self, *args: str, user: str = "chaos_pub") -> str:
        """Run ``manage.py`` with the run's settings on its database; return its output."""
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env={**os.environ, **self.env(user)},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"manage.py {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
            )
        return result.stdout

    def setup(self) -> None:
        """Start the server, create the database and the logins, migrate."""
        self.server.start()
        self.server.create_database(self.database)
        for user in ["chaos_pub", *(f"chaos_w{i}" for i in range(self.workers))]:
            self.server.create_user(user, PASSWORD)
        self.manage("migrate", "--verbosity", "0")

    def t(self, moment: float | None = None) -> float:
        """Seconds since the run started."""
        return (time.monotonic() if moment is None else moment) - self.t0

    # -- faults ------------------------------------------------------------------------------

    def protected_pids(self) -> set[int]:
        """Workers no fault may hit right now (none by default)."""
        return set()

    def victim(self, min_age: float = 3.0, timeout: float = 20.0) -> tuple[str, ConsumerProcess] | None:
        """A random live worker, up for ``min_age`` s, not protected; None if there is none for ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            protected = self.protected_pids()
            now = time.monotonic()
            candidates = [
                (slot, p)
                for slot, p in self.supervisor.live()
                if p.pid not in protected and now - self.supervisor.started_at[p.pid] >= min_age
            ]
            if candidates:
                return self.rng.choice(candidates)
            time.sleep(0.2)
        return None

    def kill9(self, min_age: float = 3.0) -> None:
        chosen = self.victim(min_age)
        if chosen is None:
            return
        slot, process = chosen
        at = time.monotonic()
        os.kill(process.pid, signal.SIGKILL)
        self.faults.append(Fault("kill -9", at, process.pid, slot))

    def sigstop(self, min_age: float = 3.0) -> None:
        chosen = self.victim(min_age)
        if chosen is None:
            return
        slot, process = chosen
        at = time.monotonic()
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(self.stop_seconds)
        offset = len(process.log())
        until = time.monotonic()  # before SIGCONT: whatever it handles next ends after this
        os.kill(process.pid, signal.SIGCONT)
        self.faults.append(
            Fault("SIGSTOP", at, process.pid, slot, until=until, log_offset=offset,
                  detail=f"stopped {self.stop_seconds:.1f}s")
        )  # fmt: skip

    def cleanup(self, keep: bool = False) -> None:
        """Stop the workers and the server; remove the run's directory unless ``keep``."""
        try:
            self.supervisor.stop()
        finally:
            if keep:  # every worker's log beside the records, for the post-mortem
                for process in self.supervisor.every:
                    (self.directory / f"worker-{process.name}-{process.pid}.log").write_text(process.log())
            self.supervisor.cleanup()
            self.server.cleanup()
            if not keep:
                shutil.rmtree(self.directory, ignore_errors=True)

"""The chaos run: real workers, a real publisher and a private server, faults injected, then accounted for.

:class:`ChaosRun` starts a private MariaDB or PostgreSQL server (tests/support/dbservers.py),
migrates it, starts ``runconsumer`` workers under a small process manager (a worker that
dies or exits is started again, as systemd's ``Restart=always`` would; the server, the
process manager, ``kill -9`` and ``SIGSTOP`` are shared with the other chaos runs, in
tests/chaos/faults.py) and the publisher (tests/chaos/publisher.py), and meanwhile injects
faults one after the other:

- ``kill -9`` of a random worker;
- ``SIGSTOP`` of a worker for longer than ``LEASE_DURATION``, then ``SIGCONT``: at a
  random moment, and inside a handler of the batching group, in the middle of a batch
  (the handler stops its own process when the harness asks it to);
- server-side kills of every session of a worker (MariaDB ``KILL CONNECTION``,
  PostgreSQL ``pg_terminate_backend``);
- a restart of the server (stopped, a few seconds down, started on the same data
  directory and port);
- a hung handler: the publisher publishes one message whose handler never returns.

When everything published was handled (or a deadline passed) it stops the workers and
:func:`analyse` reads the records: what the publisher saw committed, what each group
handled (tests/chaos/chaosapp/consumers.py writes one line per handling), and computes
losses, duplicates, per-key order violations and the time to recover after each fault.
The rules are documented in docs/reliability.md; :func:`format_report` prints them.

Times are ``time.monotonic()`` of this machine (the same clock in every process).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.faults import Fault, FaultRun
from tests.support.processes import ROOT, ConsumerProcess

EVENTS = "chaos.events"
HANG = "chaos.hang"
HANG_DLQ = "chaos.hang_dlq"
GROUPS = ("strict", "batch")
HANG_GROUP = "batch"
HUNG_ID = "hung-1"
SETTINGS = "tests.chaos.settings"
LEASE_DURATION = 3.0
VISIBILITY_TIMEOUT = 4.0
#: A fault's victim "held" the partitions it handled in the last WINDOW seconds before it.
WINDOW = 2.0


@dataclass
class Plan:
    """What a run does; the defaults are the CI run (about 2 minutes per database)."""

    messages: int = 10_000
    keys: int = 100
    rate: float = 95.0  # messages per second
    workers: int = 3
    #: --concurrency of each worker slot (cycled): both the inline and the threaded executor.
    concurrency: tuple[int, ...] = (1, 1, 2)
    kills: int = 24
    #: SIGSTOPs at a random moment, and inside a handler in the middle of a batch.
    stops: int = 2
    pauses_in_handler: int = 2
    connection_kills: int = 3
    restarts: int = 1
    #: Seconds between two faults; a SIGSTOP lasts stop_seconds, a restart keeps the server down_seconds.
    gap: float = 2.2
    stop_seconds: float = LEASE_DURATION + 2.5
    #: SIGSTOPs inside a batch's outcome transaction (lease rows share-locked), early in the
    #: run, for longer than a normal SIGSTOP: others must take its partitions *before* SIGCONT.
    pauses_in_fence: int = 1
    fence_stop_seconds: float = LEASE_DURATION + 5.0
    down_seconds: float = 3.0
    #: The hung message is published after this fraction of the others.
    hang_at: float = 0.12
    #: After the publisher is done: how long to wait for everything to be handled.
    drain_timeout: float = 90.0
    seed: int = 0

    def schedule(self, rng: random.Random) -> list[str]:
        """The faults in order: the rarer kinds spread evenly among the kills."""
        rare = (
            ["conn"] * self.connection_kills
            + ["stop"] * self.stops
            + ["pause"] * self.pauses_in_handler
            + ["restart"] * self.restarts
        )
        rng.shuffle(rare)
        faults = ["kill"] * self.kills
        step = len(faults) / (len(rare) + 1)
        for i, kind in enumerate(rare):
            faults.insert(round(step * (i + 1)) + i, kind)
        for _ in range(self.pauses_in_fence):
            faults.insert(1, "fence")
        return faults


@dataclass(frozen=True)
class Record:
    """One line of a worker's file: a handling completed (``handled``) or a hang begun (``hang``)."""

    kind: str
    group: str
    topic: str
    partition: int
    offset: int
    id: str
    key: str
    seq: int
    attempt: int
    pid: int
    slot: str
    start: float
    end: float

    @classmethod
    def parse(cls, line: str) -> Record:
        f = line.split("\t")
        return cls(
            f[0], f[1], f[2], int(f[3]), int(f[4]), f[5], f[6], int(f[7]), int(f[8]), int(f[9]), f[10],
            float(f[11]), float(f[12]),
        )  # fmt: skip

    @property
    def gp(self) -> tuple[str, str, int]:
        return (self.group, self.topic, self.partition)


@dataclass(frozen=True)
class Published:
    id: str
    topic: str
    key: str
    seq: int
    at: float
    created: bool
    attempts: int

    @classmethod
    def parse(cls, line: str) -> Published:
        f = line.split("\t")
        return cls(f[0], f[1], f[2], int(f[3]), float(f[4]), f[5] == "1", int(f[6]))


class Ledger:
    """Reads the records (worker files) and the publisher's file incrementally."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.records: list[Record] = []
        self.published: dict[str, Published] = {}
        self._offsets: dict[Path, int] = {}
        self._lock = threading.Lock()

    def _new_lines(self, path: Path) -> list[str]:
        offset = self._offsets.get(path, 0)
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # only complete lines; a line being written is read next time
        self._offsets[path] = offset + end
        return data[:end].decode().splitlines()

    def refresh(self) -> None:
        with self._lock:
            for path in sorted(self.directory.glob("handled-*.tsv")):
                self.records.extend(Record.parse(line) for line in self._new_lines(path))
            published = self.directory / "published.tsv"
            if published.exists():
                for line in self._new_lines(published):
                    p = Published.parse(line)
                    self.published[p.id] = p

    def handled_ids(self, group: str) -> set[str]:
        return {r.id for r in self.records if r.kind == "handled" and r.group == group and r.topic == EVENTS}


@dataclass
class Report:
    database: str
    seed: int
    duration: float
    published: int
    publish_failures: int
    ambiguous_commits: int
    groups: dict[str, dict[str, Any]]
    faults: list[Fault]
    hung: dict[str, Any]
    exits: dict[str, int]
    late_handlings: int
    late_fenced: int
    late_unfenced: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Why workers exited by themselves (status > 0): the last error line of each one's log,
    #: counted. Reported, not judged: the hung handler's worker exits so by design.
    exit_reasons: dict[str, int] = field(default_factory=dict)

    def recovery_stats(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        kinds: dict[str, list[Fault]] = defaultdict(list)
        for fault in self.faults:
            kinds[fault.kind].append(fault)
        for kind, faults in kinds.items():
            times = [f.recovery for f in faults if f.recovery is not None]
            out[kind] = {
                "count": len(faults),
                "measured": len(times),
                "min": min(times) if times else None,
                "median": statistics.median(times) if times else None,
                "max": max(times) if times else None,
            }
        return out

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["recovery"] = self.recovery_stats()
        return data


class ChaosRun(FaultRun):
    settings = SETTINGS

    def __init__(self, kind: str, plan: Plan, log: Any = print) -> None:
        self.plan = plan
        super().__init__(kind, seed=plan.seed, workers=plan.workers, stop_seconds=plan.stop_seconds, log=log)
        self.ledger = Ledger(self.directory)
        self.publisher: subprocess.Popen[bytes] | None = None
        self._dlq_seen = False

    # -- setup -------------------------------------------------------------------------------

    def spawn(self, slot: str, generation: int) -> ConsumerProcess:
        index = int(slot[1:])
        concurrency = self.plan.concurrency[index % len(self.plan.concurrency)]
        # The hung handler runs on the workers of --concurrency 1 only, where it stalls
        # every partition of its worker unless the handler timeout frees it.
        topics = ["--topic", EVENTS] if concurrency > 1 else []
        return ConsumerProcess(
            f"{slot}.{generation}",
            "--concurrency",
            str(concurrency),
            *topics,
            settings=SETTINGS,
            verbosity="1",
            env=self.env(user=f"chaos_{slot}"),
        )

    # -- faults ------------------------------------------------------------------------------

    def protected_pids(self) -> set[int]:
        """Workers left alone: one with the hung handler in hand, until the message moved on.

        The handler timeout, not a kill, must free it: so its process is not killed,
        stopped or disconnected until a later attempt of the hung message started elsewhere
        or the message reached the dead-letter topic.
        """
        self.ledger.refresh()
        hangs = sorted((r for r in self.ledger.records if r.kind == "hang"), key=lambda r: r.start)
        if not hangs or self.hung_dead_lettered():
            return set()
        return {hangs[-1].pid}

    def hung_dead_lettered(self) -> bool:
        if not self._dlq_seen:
            try:
                rows = self.server.execute("SELECT COUNT(*) FROM queue_messages WHERE topic = %s", (HANG_DLQ,), "chaos")
                self._dlq_seen = bool(rows and rows[0][0])
            except Exception:  # noqa: BLE001 - the server may be down (the restart fault): not yet
                return False
        return self._dlq_seen

    def pause_in_handler(self) -> None:
        """SIGSTOP inside a handler of the batching group (the rest of its batch in hand), SIGCONT later."""
        self._pause_on_request(
            "pause",
            "SIGSTOP in handler",
            self.plan.stop_seconds,
            "in a handler of",
            "handled no message of the batching group",
        )

    def pause_in_fence(self) -> None:
        """SIGSTOP inside a handler thread's outcome transaction, its lease rows share-locked
        (tests/chaos/chaosapp/consumers.py, ``freeze_in_fence``), SIGCONT after longer than a lease."""
        self._pause_on_request(
            "ackpause",
            "SIGSTOP in ack",
            self.plan.fence_stop_seconds,
            "in an ack of",
            "wrote no outcome on a handler thread",
        )

    def _pause_on_request(self, request: str, kind: str, seconds: float, where: str, nothing: str) -> None:
        """Ask a victim to stop itself (the file ``<request>-<pid>``, which the test app takes
        and answers with a ``<request>`` record before its SIGSTOP), SIGCONT it ``seconds``
        after the stop, and record the fault as ``kind``."""
        chosen = self.victim()
        if chosen is None:
            return
        slot, process = chosen
        path = self.directory / f"{request}-{process.pid}"
        asked = time.monotonic()
        path.touch()
        deadline = asked + 10
        paused: Record | None = None
        while paused is None:
            self.ledger.refresh()
            # This request's pause: a process paused before has an older record.
            paused = next(
                (r for r in self.ledger.records if r.kind == request and r.pid == process.pid and r.start >= asked),
                None,
            )
            if paused is None and (time.monotonic() > deadline or not process.alive()):
                try:
                    path.unlink()
                    self.log(f"{slot} (pid {process.pid}) {nothing} in 10 s: no pause")
                    return
                except FileNotFoundError:  # taken just now: its record follows
                    deadline = time.monotonic() + 5
            time.sleep(0.02)
        time.sleep(max(0.0, paused.start + seconds - time.monotonic()))
        offset = len(process.log())
        until = time.monotonic()
        process.signal(signal.SIGCONT)
        self.faults.append(
            Fault(kind, paused.start, process.pid, slot, until=until, log_offset=offset,
                  detail=f"stopped {seconds:.1f}s {where} {paused.group} p{paused.partition}")
        )  # fmt: skip

    def connection_kill(self) -> None:
        chosen = self.victim()
        if chosen is None:
            return
        slot, process = chosen
        at = time.monotonic()
        killed = self.server.kill_connections(f"chaos_{slot}")
        what = "KILL CONNECTION" if self.kind == "mariadb" else "pg_terminate_backend"
        self.faults.append(Fault("connection kill", at, process.pid, slot, detail=f"{what} x{len(killed)}"))

    def restart(self) -> None:
        at = time.monotonic()
        self.server.stop()
        time.sleep(self.plan.down_seconds)
        self.server.start()
        up = time.monotonic()
        self.faults.append(Fault("server restart", at, until=up, detail=f"down {up - at:.1f}s"))

    # -- the run -----------------------------------------------------------------------------

    def start_publisher(self) -> None:
        out = open(self.directory / "publisher.log", "wb")  # noqa: SIM115 - the child writes to it
        self.publisher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.chaos.publisher",
                str(self.plan.messages),
                str(self.plan.keys),
                str(self.plan.rate),
                str(int(self.plan.messages * self.plan.hang_at)),
                str(self.directory / "published.tsv"),
            ],
            cwd=ROOT,
            env={**os.environ, **self.env("chaos_pub"), "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()

    def all_handled(self) -> bool:
        self.ledger.refresh()
        events = {i for i, p in self.ledger.published.items() if p.topic == EVENTS}
        return all(events <= self.ledger.handled_ids(g) for g in GROUPS) and self.hung_dead_lettered()

    def execute(self) -> Report:
        self.setup()
        self.t0 = time.monotonic()
        self.supervisor.start()
        time.sleep(2.0)  # the workers share the partitions out before the first message
        self.start_publisher()
        assert self.publisher is not None
        actions = {
            "kill": self.kill9,
            "stop": self.sigstop,
            "pause": self.pause_in_handler,
            "fence": self.pause_in_fence,
            "conn": self.connection_kill,
            "restart": self.restart,
        }
        time.sleep(self.plan.gap)
        for kind in self.plan.schedule(self.rng):
            if self.publisher.poll() is not None:
                self.log(f"the publisher finished before the faults did (at {kind!r}); the rest is skipped")
                break
            actions[kind]()
            time.sleep(self.plan.gap)
        self.publisher.wait(timeout=600)
        published_at = time.monotonic()
        deadline = published_at + self.plan.drain_timeout
        while time.monotonic() < deadline and not self.all_handled():
            time.sleep(0.5)
        duration = time.monotonic() - self.t0
        self.supervisor.stop()
        self.ledger.refresh()
        return analyse(self, duration)

    def cleanup(self, keep: bool = False) -> None:
        try:
            if self.publisher is not None and self.publisher.poll() is None:
                self.publisher.kill()
                self.publisher.wait(10)
        finally:
            super().cleanup(keep)


# -- the accounting ---------------------------------------------------------------------------


def first_handlings(records: Iterable[Record]) -> dict[str, Record]:
    """Each message's first completed handling (earliest start)."""
    first: dict[str, Record] = {}
    for r in records:
        if r.id not in first or r.start < first[r.id].start:
            first[r.id] = r
    return first


def order_violations(first: dict[str, Record], exempt: set[str]) -> list[str]:
    """Messages whose first handling started before that of an earlier message of their key.

    Per key, walking the messages in publish order (seq), a message counts as a violation
    when its first handling started before the latest first handling of an earlier one.
    Messages in ``exempt`` are left out on both sides (the batching group's redeliveries).
    """
    by_key: dict[str, list[Record]] = defaultdict(list)
    for r in first.values():
        if r.id not in exempt:
            by_key[r.key].append(r)
    violations = []
    for key, records in by_key.items():
        latest: Record | None = None
        for r in sorted(records, key=lambda r: r.seq):
            if latest is not None and r.start < latest.start:
                violations.append(
                    f"{r.group} key {key}: seq {r.seq} first handled at {r.start:.3f} (pid {r.pid}, attempt "
                    f"{r.attempt}) before seq {latest.seq} at {latest.start:.3f} (pid {latest.pid}, attempt "
                    f"{latest.attempt})"
                )
            if latest is None or r.start > latest.start:
                latest = r
    return violations


def held(records: list[Record], pid: int, at: float, exclude_topic: str = HANG) -> set[tuple[str, str, int]]:
    """The (group, topic, partition)s ``pid`` handled in the WINDOW seconds before ``at``."""
    return {r.gp for r in records if r.pid == pid and at - WINDOW <= r.end <= at and r.topic != exclude_topic}


def by_partition(records: Iterable[Record]) -> dict[tuple[str, str, int], list[Record]]:
    """Records per (group, topic, partition), each list in order of start."""
    index: dict[tuple[str, str, int], list[Record]] = defaultdict(list)
    for r in records:
        index[r.gp].append(r)
    for rs in index.values():
        rs.sort(key=lambda r: r.start)
    return index


#: Seconds before the last publish within which a fault's partitions may have no work left.
NEAR_END = 5.0


def idle(
    index: dict[tuple[str, str, int], list[Record]], gps: set[tuple[str, str, int]], after: float
) -> set[tuple[str, str, int]]:
    """Those of ``gps`` with no handling at all that started after ``after``: nothing to resume.

    At the end of a run a fault can come after the last message of a partition was handled,
    with none published to it after: there is then no handling to measure recovery by. That
    is allowed only within NEAR_END seconds of the last publish (``analyse``). A partition
    stalled for good would also leave its messages unhandled, counted as lost (the drain waits
    for every message before the analysis).
    """
    return {gp for gp in gps if not any(r.start > after for r in index.get(gp, ()))}


def resumed(
    index: dict[tuple[str, str, int], list[Record]],
    gps: set[tuple[str, str, int]],
    after: float,
    other_than: int | None = None,
) -> float | None:
    """Seconds after ``after`` until each of ``gps`` had a handling start again (by a pid other than ``other_than``)."""
    latest = after
    for gp in gps:
        start = next((r.start for r in index.get(gp, ()) if r.start > after and r.pid != other_than), None)
        if start is None:
            return None
        latest = max(latest, start)
    return latest - after


def reacquired(log: str) -> set[tuple[str, str, int]]:
    """The (group, topic, partition)s a worker's log says it acquired (``acquired leases`` lines)."""
    found = set()
    for group, topic, partitions in re.findall(
        r"acquired leases group=(\S+) topic=(\S+) partitions=\[([\d, ]*)\]", log
    ):
        found |= {(group, topic, int(p)) for p in partitions.split(",") if p.strip()}
    return found


def late_handlings(
    records: list[Record], fault: Fault, taken_back: set[tuple[str, str, int]]
) -> tuple[list[Record], int, list[str]]:
    """Handlings by a SIGSTOPped worker, after SIGCONT, of messages it had been given before the stop.

    A handling is late when it ended within 2 s after SIGCONT and another worker had
    meanwhile handled a later offset of the same partition (it took the partition while
    the victim was paused). Returns those; how many were fenced (no other worker had
    handled the message before, and it came back afterwards, a higher attempt: the paused
    worker's late ack was dropped by the lease fence, the message stayed in flight and was
    redelivered after its visibility timeout); and those never redelivered, which an
    accepted late ack would explain.

    The fence is the lease: a worker that took a partition back after SIGCONT
    (``taken_back``, from its log) may ack what it handles there, so a message of such a
    partition that was not redelivered proves nothing and is not counted as unfenced.
    """
    assert fault.pid is not None and fault.until is not None
    by_gp = by_partition(records)
    by_id: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in records:
        by_id[(r.group, r.id)].append(r)
    late = []
    for r in records:
        if r.pid != fault.pid or not fault.until < r.end <= fault.until + 2:
            continue
        if any(o.pid != fault.pid and fault.at < o.start < r.end and o.offset > r.offset for o in by_gp[r.gp]):
            late.append(r)
    fenced = 0
    unfenced = []
    for r in late:
        same = by_id[(r.group, r.id)]
        if any(o.pid != fault.pid and o.start < r.end for o in same):
            continue  # already redelivered while the victim was paused: nothing left to fence
        if any(o.attempt > r.attempt and o.start > r.end for o in same):
            fenced += 1  # its late ack was dropped: the message came back
        elif r.gp not in taken_back:
            unfenced.append(
                f"{r.group} {r.id} (attempt {r.attempt}) handled late by paused pid {r.pid} and never redelivered"
            )
    return late, fenced, unfenced


def analyse(run: ChaosRun, duration: float) -> Report:
    ledger = run.ledger
    records = [r for r in ledger.records if r.kind == "handled"]
    hangs = sorted((r for r in ledger.records if r.kind == "hang"), key=lambda r: r.start)
    published = ledger.published
    events = {i: p for i, p in published.items() if p.topic == EVENTS}
    problems: list[str] = []

    # SIGSTOP: late handlings by the paused worker (exempt from the batching group's order check).
    late: list[Record] = []
    fenced = 0
    unfenced: list[str] = []
    for fault in run.faults:
        if fault.kind.startswith("SIGSTOP"):
            process = next((p for p in run.supervisor.every if p.pid == fault.pid), None)
            taken_back = reacquired(process.log()[fault.log_offset :]) if process is not None else set()
            more, count, bad = late_handlings(records, fault, taken_back)
            fault.detail += f", {len(more)} late handlings ({count} fenced)"
            late += more
            fenced += count
            unfenced += bad
    late_keys = {(r.group, r.id, r.pid, r.start) for r in late}

    groups: dict[str, dict[str, Any]] = {}
    for group in GROUPS:
        mine = [r for r in records if r.group == group and r.topic == EVENTS]
        ids = {r.id for r in mine}
        first = first_handlings(mine)
        if group == "strict":
            exempt: set[str] = set()
        else:
            exempt = {i for i, r in first.items() if r.attempt > 1 or (r.group, r.id, r.pid, r.start) in late_keys}
        violations = order_violations(first, exempt)
        lost = sorted(set(events) - ids)
        groups[group] = {
            "handled": len(ids),
            "handlings": len(mine),
            "duplicates": len(mine) - len(ids),
            "lost": len(lost),
            "lost_ids": lost[:20],
            "unknown": sorted(ids - set(events))[:20],
            "order_checked": len(first) - len(exempt),
            "order_exempt": len(exempt),
            "order_violations": len(violations),
            "violations": violations[:20],
        }

    # The hung message: its attempts, and its dead letter.
    dead = []
    try:
        dead = run.server.execute(
            "SELECT id, failure_count, last_error FROM queue_messages WHERE topic = %s", (HANG_DLQ,), "chaos"
        )
    except Exception as exc:  # noqa: BLE001 - reported as a problem of the run
        problems.append(f"could not read {HANG_DLQ}: {exc}")
    hung = {
        "published": HUNG_ID in published,
        "attempts": [(h.attempt, h.pid, round(run.t(h.start), 2)) for h in hangs],
        "dead_letters": [(str(i), int(n), str(e)[:300]) for i, n, e in dead],
    }
    if hangs:
        first_hang = hangs[0]
        run.faults.append(Fault("hung handler", first_hang.start, first_hang.pid, first_hang.slot))

    # Recovery after each fault.
    index = by_partition(records)
    last_published = max((p.at for p in events.values()), default=0.0)
    for fault in run.faults:
        if fault.kind == "server restart":
            assert fault.until is not None
            before = {r.gp for r in records if fault.at - WINDOW <= r.end <= fault.at}
            fault.recovery = resumed(index, before, fault.until)
            starts = [r.start for r in records if r.start > fault.until]
            first_after = min(starts) - fault.until if starts else None
            fault.note = (
                f"first handling {first_after:.2f}s after the server was up; all {len(before)} partitions"
                if first_after is not None
                else "nothing handled after the restart"
            )
            continue
        assert fault.pid is not None
        gps = held(records, fault.pid, fault.at)
        if not gps:
            fault.note = "held no partition (nothing handled in the 2 s before)"
            continue
        finished = idle(index, gps, fault.at)
        if finished and fault.at < last_published - NEAR_END:
            # With the publisher going on (about 12 messages a second per partition), every
            # partition has work after the fault: an idle one is a stall, whatever else holds.
            problems.append(
                f"{fault.kind} at {run.t(fault.at):.1f}s (pid {fault.pid}): {len(finished)} of its partitions "
                f"handled nothing after it, {last_published - fault.at:.1f}s before the last publish"
            )
        if finished == gps:
            fault.note = f"nothing left to resume: no message of its {len(gps)} partitions was handled after it"
            continue
        gps -= finished
        if fault.kind in ("connection kill", "hung handler"):  # the victim lives on: its own handlings count
            fault.recovery = resumed(index, gps, fault.at)
        else:
            fault.recovery = resumed(index, gps, fault.at, other_than=fault.pid)
        fault.note = f"{len(gps)} partitions" + (f" ({len(finished)} more had nothing left)" if finished else "")
        if (
            fault.kind.startswith("SIGSTOP")
            and fault.recovery is not None
            and fault.until is not None
            and fault.at + fault.recovery < fault.until
        ):
            # Others took its partitions while it was stopped: once continued, it must notice.
            process = next((p for p in run.supervisor.every if p.pid == fault.pid), None)
            if process is not None and "lost leases" not in process.log()[fault.log_offset :]:
                problems.append(
                    f"the worker SIGSTOPped at {run.t(fault.at):.1f}s did not log 'lost leases' after SIGCONT"
                )
        if fault.recovery is None:
            problems.append(f"{fault.kind} at {run.t(fault.at):.1f}s (pid {fault.pid}): its partitions never resumed")

    exits: dict[str, int] = defaultdict(int)
    reasons: dict[str, int] = defaultdict(int)
    for _slot, pid, status, _at in run.supervisor.exits:
        exits[str(status)] += 1
        if status > 0:
            process = next((p for p in run.supervisor.every if p.pid == pid), None)
            reasons[exit_reason(process.log() if process is not None else "")] += 1
    failures = sum(p.attempts - 1 for p in published.values())
    return Report(
        database=run.kind,
        seed=run.plan.seed,
        duration=duration,
        published=len(events),
        publish_failures=failures,
        ambiguous_commits=sum(1 for p in published.values() if p.attempts > 1 and not p.created),
        groups=groups,
        faults=sorted(run.faults, key=lambda f: f.at),
        hung=hung,
        exits=dict(exits),
        exit_reasons=dict(reasons),
        late_handlings=len(late),
        late_fenced=fenced,
        late_unfenced=unfenced,
        problems=problems,
    )


def exit_reason(log: str) -> str:
    """The last ERROR or CommandError line of a worker's log (timestamp and pid cut), or its last line."""
    lines = [line for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if " ERROR " in line or line.startswith(("CommandError", "django.db."))]
    line = (errors or lines or ["(empty log)"])[-1]
    return re.sub(r"^\d{4}-\d\d-\d\d [\d:,]+ ", "", line)[:200]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_report(report: Report, t0: float) -> str:
    lines = [
        (
            f"chaos run on {report.database} (seed {report.seed}): {report.duration:.0f}s, "
            f"{report.published} messages published ({report.publish_failures} failed publish attempts retried, "
            f"{report.ambiguous_commits} ambiguous commits deduplicated)"
        ),
        "",
        (
            f"{'group':<8} {'handled':>8} {'handlings':>9} {'duplicates':>10} {'lost':>5} {'order checked':>13} "
            f"{'exempt':>6} {'violations':>10}"
        ),
    ]
    for group, g in report.groups.items():
        lines.append(
            f"{group:<8} {g['handled']:>8} {g['handlings']:>9} {g['duplicates']:>10} {g['lost']:>5} "
            f"{g['order_checked']:>13} {g['order_exempt']:>6} {g['order_violations']:>10}"
        )
    lines += ["", f"{'t (s)':>7}  {'fault':<18} {'target':<14} {'recovery (s)':>12}  detail"]
    for f in report.faults:
        target = f"{f.slot} pid {f.pid}" if f.pid else "server"
        detail = "; ".join(x for x in (f.detail, f.note) if x)
        lines.append(f"{f.at - t0:>7.1f}  {f.kind:<18} {target:<14} {_fmt(f.recovery):>12}  {detail}")
    lines += ["", f"{'recovery (s)':<18} {'count':>5} {'measured':>8} {'min':>6} {'median':>6} {'max':>6}"]
    for kind, s in report.recovery_stats().items():
        stats = " ".join(f"{_fmt(s[x]):>6}" for x in ("min", "median", "max"))
        lines.append(f"{kind:<18} {s['count']:>5} {s['measured']:>8} {stats}")
    lines += [
        "",
        f"hung message: attempts (attempt, pid, t) {report.hung['attempts']}",
        f"hung message: dead letters {report.hung['dead_letters']}",
        (
            f"SIGSTOP: {report.late_handlings} late handlings by paused workers after SIGCONT; "
            f"{report.late_fenced} whose ack the lease fence had to drop, {len(report.late_unfenced)} of them not "
            "redelivered"
        ),
        f"worker exits (status: count): {report.exits}",
        *(f"  exited {n}x: {reason}" for reason, n in sorted(report.exit_reasons.items(), key=lambda r: -r[1])),
    ]
    for group, g in report.groups.items():
        for v in g["violations"]:
            lines.append(f"ORDER VIOLATION {v}")
        if g["lost_ids"]:
            lines.append(f"LOST in {group}: {g['lost_ids']}")
    lines += [f"PROBLEM {p}" for p in report.problems + report.late_unfenced]
    return "\n".join(lines)

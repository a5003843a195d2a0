"""The exactly-once run: atomic consumers under kill -9 and lease steals, their effects counted.

:class:`ExactlyOnceRun` starts a private server, publishes ``messages`` messages to
``eo.events`` before any worker runs, then starts two ``runconsumer`` workers (restart
always, tests/chaos/faults.py) that run three consumer groups of the same handler
(tests/chaos/eoapp/consumers.py: one effect row, the counter + 1, one follow-up message):
``per`` (``atomic=True``), ``batch`` (``atomic="batch"``) and ``plain`` (``atomic=False``).

Meanwhile it injects, in an order and at moments drawn from the seeded RNG and spread over
the drain (each fault waits until a random point of its share of the progress is reached):

- ``kill -9`` of a random worker at a random moment;
- ``kill -9`` inside a handler of a given group, after the handler's three writes and before
  its transaction commits (atomic) or its ack is written (plain);
- ``SIGSTOP`` of a random worker for longer than a lease, then ``SIGCONT``;
- ``SIGSTOP`` inside a handler of a given group, after its effect row, for longer than a
  lease: the partition is taken over and the message redelivered meanwhile; once continued,
  the handler finishes and its transaction must be refused by the lease fence.

When every group's watermark reached the end of every partition (or a deadline passed) it
stops the workers and :func:`account` reads the application tables: per group, the effect
rows and distinct messages among them, the counter, the follow-up messages and distinct
keys among them. Exactly once means 5,000 / 5,000 / 5,000 / 5,000 / 5,000 for each atomic
group; the ``plain`` group must show more (tests/chaos/test_exactly_once.py).
"""

from __future__ import annotations

import json
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.eoapp import EVENTS, FOLLOWUPS, GROUPS, MODES
from tests.chaos.faults import Fault, FaultRun
from tests.support.processes import ConsumerProcess

SETTINGS = "tests.chaos.settings_eo"
LEASE_DURATION = 3.0
KEYS = 50

#: Published before the workers start: ids ``m00000``..., keys ``k00``...``k49`` round-robin.
PUBLISH = """
from django_sqlqueue import publish_many
from tests.chaos.eoapp import EVENTS, GROUPS
from tests.chaos.eoapp.models import Counter

Counter.objects.bulk_create([Counter(name=group) for group in GROUPS])
count = {count}
for start in range(0, count, 500):
    publish_many(EVENTS, [
        {{"payload": {{"n": i}}, "key": f"k{{i % {keys}:02d}}", "id": f"m{{i:05d}}"}}
        for i in range(start, min(count, start + 500))
    ])
"""


def message_ids(count: int) -> set[str]:
    return {f"m{i:05d}" for i in range(count)}


@dataclass
class Plan:
    """What a run does; the defaults are the CI run (about 95 s per database on 2 cores)."""

    messages: int = 5_000
    workers: int = 2
    #: --concurrency of each worker slot (cycled): the inline and the threaded executor.
    concurrency: tuple[int, ...] = (1, 2)
    kills: int = 30
    #: kill -9 and SIGSTOP inside handlers: the groups cycled through in this order.
    kills_in_handler: int = 6
    stops: int = 1
    pauses_in_handler: int = 2
    stop_seconds: float = LEASE_DURATION + 2.5
    #: The faults are spread over the first ``spread`` of the drain, at least ``min_gap`` s apart.
    spread: float = 0.85
    min_gap: float = 0.5
    #: A worker is a victim once it has run this long (it has leases by then).
    min_age: float = 1.5
    #: Seconds each handling sleeps before its writes (EO_HANDLER_DELAY).
    delay: float = 0.002
    drain_timeout: float = 300.0
    seed: int = 0

    def schedule(self, rng: Any) -> list[str]:
        """The faults in a random order: ``kill``, ``stop``, ``kill:<group>``, ``pause:<group>``.

        The faults inside handlers fall in the first third of the run: the groups drain at
        different speeds (``batch`` commits least), and one that has drained has no handler
        left to fault.
        """
        faults = ["kill"] * self.kills + ["stop"] * self.stops
        rng.shuffle(faults)
        inside = [f"kill:{GROUPS[i % len(GROUPS)]}" for i in range(self.kills_in_handler)]
        inside += [f"pause:{GROUPS[i % len(GROUPS)]}" for i in range(self.pauses_in_handler)]
        rng.shuffle(inside)
        third = (len(faults) + len(inside)) // 3
        for fault in inside:
            faults.insert(rng.randrange(third), fault)
        return faults


@dataclass
class GroupCount:
    effects: int
    distinct: int
    counter: int
    followups: int
    followup_keys: int
    missing: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    #: Follow-ups whose payload does not reference their key's message.
    followup_mismatches: list[str] = field(default_factory=list)
    #: Messages with more than one effect row: (id, [(worker, attempt)...]).
    duplicated: list[tuple[str, list[tuple[str, int]]]] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        return self.effects == self.distinct == self.counter == self.followups == self.followup_keys and not (
            self.missing or self.unknown or self.followup_mismatches
        )


@dataclass
class InHandler:
    """A fault inside a handler, and whether that handling's effect row survived it."""

    kind: str  # "kill" (after its writes) or "pause" (after its effect row)
    group: str
    message_id: str
    attempt: int
    pid: int
    #: Filled in by account(): an effect row of this very handling (pid, attempt) exists.
    left_effect: bool | None = None


@dataclass
class Report:
    database: str
    seed: int
    messages: int
    duration: float
    drained: bool
    groups: dict[str, GroupCount]
    faults: list[Fault]
    exits: dict[str, int]
    in_handler: list[InHandler] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for f in self.faults if f.kind == kind)


class ExactlyOnceRun(FaultRun):
    settings = SETTINGS
    database = "eo"

    def __init__(self, kind: str, plan: Plan, log: Any = print) -> None:
        self.plan = plan
        super().__init__(kind, seed=plan.seed, workers=plan.workers, stop_seconds=plan.stop_seconds, log=log)
        self.in_handler: list[InHandler] = []

    def env(self, user: str) -> dict[str, str]:
        return {**super().env(user), "EO_HANDLER_DELAY": str(self.plan.delay)}

    def spawn(self, slot: str, generation: int) -> ConsumerProcess:
        concurrency = self.plan.concurrency[int(slot[1:]) % len(self.plan.concurrency)]
        return ConsumerProcess(
            f"{slot}.{generation}",
            "--concurrency",
            str(concurrency),
            settings=SETTINGS,
            verbosity="1",
            env=self.env(user=f"chaos_{slot}"),
        )

    def publish(self) -> None:
        self.manage("shell", "-c", PUBLISH.format(count=self.plan.messages, keys=KEYS))

    # -- progress ----------------------------------------------------------------------------

    def acked(self) -> dict[str, int]:
        """Messages of ``eo.events`` below each group's watermarks (all partitions)."""
        rows = self.server.execute(
            "SELECT consumer_group, SUM(offset_acked) FROM queue_offsets WHERE topic = %s GROUP BY consumer_group",
            (EVENTS,),
            self.database,
        )
        return {str(group): int(total or 0) for group, total in rows}

    def progress(self) -> float:
        """The fraction of all handlings (every group, every message) acked so far."""
        try:
            acked = self.acked()
        except Exception:  # noqa: BLE001 - a busy moment of the server: no progress seen
            return 0.0
        return sum(acked.get(g, 0) for g in GROUPS) / (self.plan.messages * len(GROUPS))

    def drained(self) -> bool:
        acked = self.acked()
        return all(acked.get(g, 0) >= self.plan.messages for g in GROUPS)

    # -- faults inside handlers ----------------------------------------------------------------

    def holders(self, group: str | None = None) -> set[str]:
        """The names of the subscribers holding a partition of ``eo.events`` (in ``group``, if given)."""
        sql = "SELECT DISTINCT leased_by FROM queue_partition_leases WHERE topic = %s"
        params: tuple[str, ...] = (EVENTS,)
        if group is not None:
            sql += " AND consumer_group = %s"
            params += (group,)
        try:
            return {str(name) for (name,) in self.server.execute(sql, params, self.database)}
        except Exception:  # noqa: BLE001 - a busy moment: none seen
            return set()

    def recent_writers(self, group: str) -> set[str]:
        """The workers that wrote the latest 30 (committed) effect rows of ``group``."""
        try:
            rows = self.server.execute(
                "SELECT worker FROM eoapp_effect WHERE consumer_group = %s ORDER BY id DESC LIMIT 30",
                (group,),
                self.database,
            )
        except Exception:  # noqa: BLE001 - a busy moment: none seen
            return set()
        return {str(worker) for (worker,) in rows}

    def holder(
        self, group: str | None = None, min_age: float | None = None, timeout: float = 5.0
    ) -> tuple[str, ConsumerProcess] | None:
        """A random live worker, up for ``min_age`` s, holding a partition (of ``group``, if given).

        With a group, one of those that wrote its latest effect rows if any does: a holder
        whose partitions wait for a visibility timeout (a message in flight at a killed
        worker) would handle nothing meanwhile.
        """
        min_age = self.plan.min_age if min_age is None else min_age
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            names = self.holders(group)
            if group is not None:
                active = names & self.recent_writers(group)
                names = active or names
            now = time.monotonic()
            candidates = [
                (slot, p)
                for slot, p in self.supervisor.live()
                if p.name in names and now - self.supervisor.started_at[p.pid] >= min_age
            ]
            if candidates:
                return self.rng.choice(candidates)
            time.sleep(0.1)
        return None

    def victim(self, min_age: float = 3.0, timeout: float = 20.0) -> tuple[str, ConsumerProcess] | None:
        """The random fault's victim: a worker with partitions in hand (a kill then costs something)."""
        return self.holder(None, min_age, timeout) or super().victim(min_age, 1.0)

    def _in_handler(self, request: str, group: str, tries: int = 3) -> tuple[str, ConsumerProcess, list[str]] | None:
        """Ask a random worker for ``request`` in a handler of ``group`` (another, up to ``tries`` times)."""
        for _ in range(tries):
            taken = self._ask(request, group)
            if taken is not None:
                return taken
        return None

    def _ask(self, request: str, group: str) -> tuple[str, ConsumerProcess, list[str]] | None:
        """Ask a random worker for ``request`` in a handler of ``group``; the handler's line once it took it."""
        if self.acked().get(group, 0) > self.plan.messages * 0.95:
            self.log(f"{group} has (almost) drained: no {request} in a handler")
            return None
        chosen = self.holder(group)
        if chosen is None:
            self.log(f"no live worker held a partition of {group} for 5 s: no {request} in a handler")
            return None
        slot, process = chosen
        path = self.directory / f"{request}-{process.pid}-{group}"
        log = self.directory / f"inhandler-{process.pid}.tsv"
        path.touch()
        deadline = time.monotonic() + 3
        while True:
            lines = [line.split("\t") for line in _lines(log)]
            taken = [f for f in lines if f[0] == request and f[1] == group]
            if taken:
                line = taken[-1]
                self.in_handler.append(InHandler(request, group, line[2], int(line[3]), process.pid))
                return slot, process, line
            if time.monotonic() > deadline or not process.alive():
                try:
                    path.unlink()
                except FileNotFoundError:  # taken just now: its line follows
                    deadline = time.monotonic() + 5
                    continue
                self.log(f"{slot} (pid {process.pid}) handled nothing of {group} in 3 s: no {request} in a handler")
                return None
            time.sleep(0.01)

    def kill_in_handler(self, group: str) -> None:
        taken = self._in_handler("kill", group)
        if taken is None:
            return
        slot, process, line = taken
        process.proc.wait(10)
        self.faults.append(
            Fault("kill -9 in handler", float(line[6]), process.pid, slot,
                  detail=f"{group} {line[2]} attempt {line[3]}, after its writes")
        )  # fmt: skip

    def pause_in_handler(self, group: str) -> None:
        taken = self._in_handler("pause", group)
        if taken is None:
            return
        slot, process, line = taken
        at = float(line[6])
        time.sleep(max(0.0, at + self.plan.stop_seconds - time.monotonic()))
        until = time.monotonic()
        process.signal(signal.SIGCONT)
        self.faults.append(
            Fault("SIGSTOP in handler", at, process.pid, slot, until=until,
                  detail=f"{group} {line[2]} attempt {line[3]}, stopped {until - at:.1f}s after its effect row")
        )  # fmt: skip

    # -- the run -------------------------------------------------------------------------------

    def execute(self) -> Report:
        self.setup()
        self.publish()
        self.t0 = time.monotonic()
        self.supervisor.start()
        schedule = self.plan.schedule(self.rng)
        # Fault i fires at a random point of the i-th share of the progress.
        targets = [(i + self.rng.uniform(0.1, 0.9)) / len(schedule) * self.plan.spread for i in range(len(schedule))]
        self.log(f"exactly-once run on {self.kind}, seed {self.seed}: {len(schedule)} faults {schedule}")
        deadline = self.t0 + self.plan.drain_timeout
        last = 0.0
        for kind, target in zip(schedule, targets, strict=True):
            while time.monotonic() < deadline and (
                self.progress() < target or time.monotonic() - last < self.plan.min_gap
            ):
                time.sleep(0.05)
            if time.monotonic() >= deadline:
                self.log(f"deadline passed before the fault {kind!r}; the rest is skipped")
                break
            what, _, group = kind.partition(":")
            if what == "kill" and group:
                self.kill_in_handler(group)
            elif what == "kill":
                self.kill9(min_age=self.plan.min_age)
            elif what == "stop":
                self.sigstop(min_age=self.plan.min_age)
            else:
                self.pause_in_handler(group)
            last = time.monotonic()
        drained = False
        while time.monotonic() < deadline:
            try:
                drained = self.drained()
            except Exception:  # noqa: BLE001 - try again
                drained = False
            if drained:
                break
            time.sleep(0.25)
        duration = time.monotonic() - self.t0
        self.supervisor.stop()
        exits: dict[str, int] = defaultdict(int)
        for _slot, _pid, status, _at in self.supervisor.exits:
            exits[str(status)] += 1
        return Report(
            database=self.kind,
            seed=self.seed,
            messages=self.plan.messages,
            duration=duration,
            drained=drained,
            groups=account(self),
            in_handler=self.in_handler,
            faults=sorted(self.faults, key=lambda f: f.at),
            exits=dict(exits),
        )


def _lines(path: Path) -> list[str]:
    try:
        data = path.read_text()
    except FileNotFoundError:
        return []
    return [line for line in data.split("\n")[:-1] if line]  # complete lines only


def account(run: ExactlyOnceRun) -> dict[str, GroupCount]:
    """Count each group's effects, counter and follow-ups in the run's database."""
    db = run.database
    expected = message_ids(run.plan.messages)
    rows = run.server.execute("SELECT consumer_group, message_id, worker, pid, attempt FROM eoapp_effect", (), db)
    effects: dict[str, dict[str, list[tuple[str, int]]]] = defaultdict(lambda: defaultdict(list))
    handlings = set()
    for group, message_id, worker, pid, attempt in rows:
        effects[str(group)][str(message_id)].append((str(worker), int(attempt)))
        handlings.add((str(group), str(message_id), int(pid), int(attempt)))
    for fault in run.in_handler:
        fault.left_effect = (fault.group, fault.message_id, fault.pid, fault.attempt) in handlings
    counters = {str(name): int(n) for name, n in run.server.execute("SELECT name, n FROM eoapp_counter", (), db)}
    key_column = "`key`" if run.kind == "mariadb" else '"key"'  # a reserved word in both
    counts = {}
    for group in GROUPS:
        mine = effects[group]
        followups = run.server.execute(
            f"SELECT {key_column}, payload FROM queue_messages WHERE topic = %s", (FOLLOWUPS[group],), db
        )
        keys = {str(key) for key, _ in followups}
        mismatches = []
        for key, payload in followups:
            data = json.loads(payload) if isinstance(payload, (str, bytes)) else payload
            if data.get("source") != key:
                mismatches.append(f"{key}: {data!r}")
        counts[group] = GroupCount(
            effects=sum(len(v) for v in mine.values()),
            distinct=len(mine),
            counter=counters.get(group, -1),
            followups=len(followups),
            followup_keys=len(keys),
            missing=sorted(expected - set(mine))[:20],
            unknown=sorted(set(mine) - expected)[:20],
            followup_mismatches=mismatches[:20],
            duplicated=sorted((i, w) for i, w in mine.items() if len(w) > 1)[:10],
        )
    return counts


def format_report(report: Report, t0: float) -> str:
    lines = [
        (
            f"exactly-once run on {report.database} (seed {report.seed}): {report.messages} messages, "
            f"{report.duration:.0f}s, {'drained' if report.drained else 'NOT DRAINED'}; faults: "
            + ", ".join(
                f"{report.count(k)} {k}" for k in ("kill -9", "kill -9 in handler", "SIGSTOP", "SIGSTOP in handler")
            )
        ),
        "",
        (
            f"{'group':<6} {'atomic':<8} {'effects':>8} {'distinct':>8} {'counter':>8} {'follow-ups':>10} "
            f"{'distinct':>8}  exactly once"
        ),
    ]
    for group, c in report.groups.items():
        lines.append(
            f"{group:<6} {MODES[group]!s:<8} {c.effects:>8} {c.distinct:>8} {c.counter:>8} {c.followups:>10} "
            f"{c.followup_keys:>8}  {'yes' if c.exactly_once else 'NO'}"
        )
    lines += ["", f"{'t (s)':>7}  {'fault':<20} {'target':<14} detail"]
    for f in report.faults:
        lines.append(f"{f.at - t0:>7.1f}  {f.kind:<20} {f.slot + ' pid ' + str(f.pid):<14} {f.detail}")
    for h in report.in_handler:
        lines.append(
            f"{h.kind} in a handler of {h.group} ({MODES[h.group]}): {h.message_id} attempt {h.attempt} pid {h.pid}: "
            f"its effect row {'survived' if h.left_effect else 'was rolled back'}"
        )
    lines.append(f"worker exits (status: count): {report.exits}")
    for group, c in report.groups.items():
        for what in ("missing", "unknown", "followup_mismatches", "duplicated"):
            if getattr(c, what):
                lines.append(f"{group} {what}: {getattr(c, what)}")
    return "\n".join(lines)

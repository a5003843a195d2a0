"""Rate limits, concurrency slots, and postponing a delivery that must wait for them.

The worker's limits (``worker/limits.py``) are enforced here, across every worker process,
by the database alone -- each admission is **one conditional write**, never a read then a
write, and no lock outlives its statement:

- **Rate limits** (``queue_rate_limits``): GCRA. A row per limit holds its *theoretical
  arrival time* (TAT, epoch seconds of the database clock). An admission is the single
  statement ``UPDATE ... SET value = GREATEST(value, now) + interval WHERE name = ? AND
  value <= now + (burst - 1) * interval``: rowcount 1 is admitted. Two workers racing for
  the last admission both evaluate the condition under the row's write lock, one after
  the other (the second sees the first's new value), so no more than the limit passes.
  The row is created on first use by an insert-if-absent (value 0: the first admission
  passes), then the UPDATE runs again.
- **Concurrency slots** (``queue_concurrency_slots``): ``n`` rows per limit, ``(name,
  slot)``. A read lists the free slots (holder empty, or expired); each candidate is then
  taken by a conditional UPDATE that repeats the condition, so of two workers reading the
  same free slot only one UPDATE matches; the other tries the next candidate. The read
  only finds candidates: correctness rests on the conditional write. A slot is released
  by its holder only (``holder = ?``): a slot that expired and was taken over is not freed
  by its late former holder. The rows are created on first use (insert-if-absent).
- **Postponing** a delivery (:meth:`LimitStore.postpone_deliveries`): the message goes back
  to the queue, due again after a delay, *without counting an attempt* -- the same status
  and ``retry_count`` arithmetic as handing it back on shutdown (``release_deliveries``),
  with ``invisible_until`` in the future. Fenced by the lease like every delivery write.

Times come from the database clock (``dialect.epoch_sql``, ``now_sql``), never a worker's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .base import IN_FLIGHT, RETRY, SCHEDULED, StoreBase


class LimitStore(StoreBase):
    """Rate limits, concurrency slots and postponed deliveries (see the module docstring)."""

    # -- rate limits (GCRA) -------------------------------------------------------------------

    def admit_rate(self, name: str, interval: float, burst: int) -> float | None:
        """Admit one delivery under the rate limit ``name`` (one admission per ``interval``
        seconds, ``burst`` at once); return None if admitted, else the seconds until the
        next admission could pass."""
        if self._try_admit(name, interval, burst):
            return None
        d = self.dialect
        rows = self._fetchall(f"SELECT value, {d.epoch_sql} FROM queue_rate_limits WHERE name = %s", [name])
        if not rows:
            # First use: create the row (a concurrent creator's row is left alone), then admit.
            conflict = d.on_conflict_ignore(["name"], "value")
            self._execute(
                f"INSERT INTO queue_rate_limits (name, value, updated_at) VALUES (%s, 0, {d.now_sql}) {conflict}",
                [name],
            )
            if self._try_admit(name, interval, burst):
                return None
            rows = self._fetchall(f"SELECT value, {d.epoch_sql} FROM queue_rate_limits WHERE name = %s", [name])
        tat, now = float(rows[0][0]), float(rows[0][1])
        return max(0.0, tat - (burst - 1) * interval - now)

    def _try_admit(self, name: str, interval: float, burst: int) -> bool:
        d = self.dialect
        now = d.epoch_sql
        # One statement: the row's write lock orders racing admissions (the WHERE is
        # evaluated again on the row the first one wrote). value <= now + (burst-1)*interval
        # is GCRA's "GREATEST(value, now) + interval - burst*interval <= now", simplified.
        return (
            self._execute(
                f"UPDATE queue_rate_limits SET value = {d.greatest_sql}(value, {now}) + %s, updated_at = {d.now_sql} "
                f"WHERE name = %s AND value <= {now} + %s",
                [interval, name, (burst - 1) * interval],
            )
            == 1
        )

    # -- concurrency slots --------------------------------------------------------------------

    def acquire_slot(self, name: str, limit: int, holder: str, ttl: float) -> int | None:
        """Take one of the ``limit`` slots of ``name`` for ``holder`` until now + ``ttl``
        seconds (a dead holder's slot is free again then); return the slot, or None if all
        are held."""
        d = self.dialect
        free = f"(holder = '' OR expires_at <= {d.now_sql})"
        for _ in range(2):
            rows = self._fetchall(
                f"SELECT slot, CASE WHEN {free} THEN 1 ELSE 0 END FROM queue_concurrency_slots "
                "WHERE name = %s AND slot < %s ORDER BY slot",
                [name, limit],
            )
            until, until_params = d.now_plus(ttl)
            for slot, is_free in rows:
                if not is_free:
                    continue
                # The condition again: of two workers that read the same free slot, one matches.
                taken = self._execute(
                    f"UPDATE queue_concurrency_slots SET holder = %s, expires_at = {until} "
                    f"WHERE name = %s AND slot = %s AND {free}",
                    [holder, *until_params, name, int(slot)],
                )
                if taken == 1:
                    return int(slot)
            if len(rows) >= limit:
                return None
            self._create_slots(name, limit)  # first use (or a raised limit): then look again
        return None

    def _create_slots(self, name: str, limit: int) -> None:
        """Insert the slots of ``name`` that do not exist yet (free), in slot order."""
        d = self.dialect
        conflict = d.on_conflict_ignore(["name", "slot"], "holder")
        values = ", ".join([f"(%s, %s, '', {d.now_sql})"] * limit)
        params: list[Any] = []
        for slot in range(limit):
            params += [name, slot]
        self._execute(
            f"INSERT INTO queue_concurrency_slots (name, slot, holder, expires_at) VALUES {values} {conflict}", params
        )

    def release_slot(self, name: str, slot: int, holder: str) -> bool:
        """Free ``slot`` of ``name`` if ``holder`` still holds it; return whether it did."""
        return (
            self._execute(
                f"UPDATE queue_concurrency_slots SET holder = '', expires_at = {self.dialect.now_sql} "
                "WHERE name = %s AND slot = %s AND holder = %s",
                [name, slot, holder],
            )
            == 1
        )

    # -- postponing ---------------------------------------------------------------------------

    def postpone_deliveries(
        self, group: str, topic: str, name: str, postponed: Sequence[tuple[int, int, float]]
    ) -> None:
        """Hand in-flight deliveries ``(partition, offset, delay)`` back, due again after
        ``delay`` seconds, **without counting an attempt** (the arithmetic of
        ``release_deliveries``: the next delivery's attempt number is this one's). Only the
        partitions ``name`` still holds are written; one statement per distinct delay."""
        if not postponed:
            return
        by_delay: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for partition, offset, delay in postponed:
            by_delay[max(0, round(delay * 1000))].append((partition, offset))
        with self.transaction() as cursor:
            held = self.lock_held(cursor, group, topic, name, sorted({p for p, _, _ in postponed}))
            for ms, keys in sorted(by_delay.items()):
                keys = [k for k in keys if k[0] in held]
                if not keys:
                    continue
                until, until_params = self.dialect.now_plus(ms / 1000)
                match, match_params = self.match_offsets(keys)
                # status before retry_count: MySQL evaluates SET left to right, and the
                # status depends on the retry_count mark_delivered left.
                cursor.execute(
                    f"UPDATE queue_delivery_state SET status = CASE WHEN retry_count > 0 THEN {RETRY} "
                    f"ELSE {SCHEDULED} END, retry_count = CASE WHEN retry_count > 0 THEN retry_count - 1 ELSE 0 END, "
                    f"invisible_until = {until} "
                    f"WHERE consumer_group = %s AND topic = %s AND acked = FALSE AND status = {IN_FLIGHT} AND {match}",
                    [*until_params, group, topic, *match_params],
                )

"""The SQL of task batches' counts (``queue_task_batches``), run on an ack's cursor.

``tasks/batches.py`` calls these from inside the transaction that acks or dead-letters
batch members (``settle.py``): plain functions of that transaction's cursor, never a
transaction of their own.

**The hot row.** Every member of a batch increments the same row. The UPDATE takes that
row's exclusive lock and keeps it until the ack's COMMIT, so these statements come last
in the ack transaction (after the lease, watermark and delivery rows), and one ack
transaction increments each batch once (``+k`` for its k members), batches in id order:
two ack transactions lock batch rows in the same order, so they never deadlock on them;
a worker waits for another's increment at most for the rest of that short transaction.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ..dialects import Dialect
from ..dialects.base import in_list


@dataclass(frozen=True)
class FinishedBatch:
    """A batch whose last member was just counted: what its callback needs."""

    id: str
    backend: str
    on_finish: str
    on_finish_queue: str
    total: int
    succeeded: int
    failed: int
    metadata: Any


def result_statuses(cursor: Any, result_ids: Collection[str]) -> dict[str, str]:
    """The status of each of ``result_ids``' result rows (a missing row is left out)."""
    if not result_ids:
        return {}
    ids = sorted(set(result_ids))
    cursor.execute(f"SELECT id, status FROM queue_task_results WHERE id IN ({in_list(ids)})", ids)
    return {str(i): str(s) for i, s in cursor.fetchall()}


def add_counts(cursor: Any, counts: Mapping[str, tuple[int, int]]) -> list[FinishedBatch]:
    """Add ``(succeeded, failed)`` to each batch; return the batches this completed.

    Only unfinished batches count (``finished_at IS NULL``): once a batch has fired its
    callback, nothing can make it fire again. A batch id without a row (not ours, or
    pruned) changes nothing. The batches completed are read back under the row locks
    the UPDATEs hold, so no other transaction can complete the same batch meanwhile.
    """
    ids = sorted(counts)
    for batch_id in ids:
        succeeded, failed = counts[batch_id]
        cursor.execute(
            "UPDATE queue_task_batches SET succeeded = succeeded + %s, failed = failed + %s "
            "WHERE id = %s AND finished_at IS NULL",
            [succeeded, failed, batch_id],
        )
    if not ids:
        return []
    cursor.execute(
        "SELECT id, backend, on_finish, on_finish_queue, total, succeeded, failed, metadata FROM queue_task_batches "
        f"WHERE id IN ({in_list(ids)}) AND finished_at IS NULL AND succeeded + failed >= total ORDER BY id",
        ids,
    )
    return [
        FinishedBatch(
            id=str(row[0]),
            backend=str(row[1]),
            on_finish=str(row[2]),
            on_finish_queue=str(row[3]),
            total=int(row[4]),
            succeeded=int(row[5]),
            failed=int(row[6]),
            metadata=json.loads(row[7]) if isinstance(row[7], (str, bytes)) else row[7],
        )
        for row in cursor.fetchall()
    ]


def mark_finished(cursor: Any, dialect: Dialect, batch_id: str, callback_id: str) -> None:
    """The batch's callback was enqueued (``callback_id``; "" if it could not be): it is finished."""
    cursor.execute(
        f"UPDATE queue_task_batches SET finished_at = {dialect.now_sql}, callback_id = %s WHERE id = %s",
        [callback_id, batch_id],
    )

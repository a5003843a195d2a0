"""The worker's side of cancelling (``ops/task_cancel.py``): a cancelled task is not run.

:func:`check_batch`, called once per fetched batch of task messages before any of them
runs (``TaskHandler.before_batch``, called by ``worker/dispatch.py``), finds which of the
batch's tasks have a result row already -- one plain ``SELECT id, status ... WHERE id IN
(...)`` per batch (``db/store/task_batches.result_statuses``, not an ORM query), the
whole cost of cancelling for a plain task. :func:`may_have_row` then tells the handler
whether a first attempt may run with its row written lazily (no row:
``tasks/marks.py``) or must take the locked path of ``results.begin``, which does not run a
task whose row is finished (cancelled). Why a cancel that comes after the check is still
decided one way: ``ops/task_cancel.py``'s docstring.

No import of ``ops/`` here: the testing helpers run the worker and may not import it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from django.db import connections

from ..conf import get_settings
from ..db.store.task_batches import result_statuses
from ..task_models import TaskResultRecord

logger = logging.getLogger(__name__)

#: Ids per statement of the batch check (SQLite's oldest variable limit is 999).
CHECK_CHUNK = 500

#: This thread's latest batch: (the result ids checked, those that have a row).
_checked = threading.local()


def check_batch(messages: Sequence[Any]) -> None:
    """Before a fetched batch of task messages runs: note which of its tasks have a result row.

    Runs after the fetch committed the batch's deliveries (IN_FLIGHT): the order the
    cancel's argument rests on (``ops/task_cancel.py``). A failed read leaves the batch
    unchecked: :func:`may_have_row` then asks per task.
    """
    ids: list[str] = []
    for m in messages:
        payload = m.payload
        given = payload.get("result_id") if isinstance(payload, dict) else None
        ids.append(given if isinstance(given, str) and given else m.id)
    _checked.batch = None
    if not ids:
        return
    try:
        found: set[str] = set()
        # One plain statement per chunk, not the ORM's: it runs for every fetched batch.
        with connections[get_settings().DATABASE].cursor() as cursor:
            for start in range(0, len(ids), CHECK_CHUNK):
                found.update(result_statuses(cursor, ids[start : start + CHECK_CHUNK]))
    except Exception:  # each task is asked on its own instead
        logger.warning("could not check a batch's tasks for result rows; checking each", exc_info=True)
        return
    _checked.batch = (frozenset(ids), found)


def may_have_row(result_id: str) -> bool:
    """Whether the task may have a result row (then its first attempt takes the locked path).

    Answered from this thread's latest :func:`check_batch` when it covered the task, else
    by a read of its own (a handler called outside a checked batch).
    """
    batch = getattr(_checked, "batch", None)
    if batch is not None and result_id in batch[0]:
        return result_id in batch[1]
    return TaskResultRecord.objects.using(get_settings().DATABASE).filter(id=result_id).exists()

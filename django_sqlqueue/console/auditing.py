"""The audit of bulk actions: one ``LogEntry`` per batch, committed with the batch's writes.

A bulk replay or purge of dead letters (by selection or "everything matching") and a topic
purge commit one transaction per batch, all in one HTTP request. Audited once at the end,
a request killed part-way (a proxy or worker timeout, an error in a later batch) left the
batches it had committed with no ``LogEntry``. The ops layer calls ``on_batch`` inside each
batch's transaction, after its writes; the callback made here writes the batch's entry
there, so a batch and its entry commit together or not at all.

That needs the ``LogEntry`` table on the queue's database connection. When the database
router writes ``LogEntry`` to another alias than ``SQLQUEUE["DATABASE"]``, no transaction
spans both: the entry is then written right after the batch commits
(``transaction.on_commit`` on the queue's alias), and a process killed between the two
loses that one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.admin.models import LogEntry
from django.db import router, transaction
from django.http import HttpRequest

from ..ops.base import alias
from .base import audit


def same_transaction(using: str | None = None) -> bool:
    """Whether a ``LogEntry`` is written on the queue's connection (``using``, else SQLQUEUE's)."""
    return router.db_for_write(LogEntry) == alias(using)


def audit_batches(
    request: HttpRequest,
    target: str,
    describe: Callable[[Any], str],
    *,
    deletion: bool = False,
    using: str | None = None,
) -> Callable[[Any], None]:
    """Return an ``on_batch`` callback that audits each batch: ``describe(result)``, numbered.

    Called by the ops layer inside the batch's transaction: an error raised here (the
    ``LogEntry`` could not be written) rolls the batch back too.
    """
    queue = alias(using)
    inside = same_transaction(queue)
    batches = 0

    def on_batch(result: Any) -> None:
        nonlocal batches
        batches += 1
        message = f"{describe(result)} (batch {batches})."
        if inside:
            audit(request, target, message, deletion=deletion)
        else:
            transaction.on_commit(lambda: audit(request, target, message, deletion=deletion), using=queue)

    return on_batch

"""``manage.py queue_cancel_task RESULT_ID [RESULT_ID ...]``: cancel tasks of the tasks backend.

A task that has not started never runs (its result: FAILED, ``TaskCancelled``); a running
one has its cancel flag set (``django_sqlqueue.tasks.cancel_requested``); a finished one
is left as it is. The decision is ``ops/task_cancel.py``'s, shared with the console.
"""

from __future__ import annotations

import getpass
import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_sqlqueue.ops.task_cancel import CancelOutcome, cancel_task, check_result_id

from . import _args
from ._console import confirm, ops_errors

logger = logging.getLogger("django_sqlqueue.commands")

#: What the command prints for each outcome.
SAID = {
    CancelOutcome.CANCELLED: "cancelled: it will not run (its result is FAILED, TaskCancelled)",
    CancelOutcome.REQUESTED: "running: cancel requested (the task sees cancel_requested() True)",
    CancelOutcome.FINISHED: "already finished: nothing changed",
    CancelOutcome.UNKNOWN: "unknown: no task has this id",
}


class Command(BaseCommand):
    help = (
        "Cancel tasks by their result id: one not started yet never runs (FAILED, TaskCancelled); "
        "a running one has its cancel flag set; a finished one is left as it is."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("result_ids", nargs="+", type=_args.text(), metavar="RESULT_ID", help="task result id")
        parser.add_argument("--by", type=_args.text(), default=None, help="who cancels (default: the OS user)")
        parser.add_argument(
            "--yes", "--noinput", "--no-input", dest="yes", action="store_true", help="do not ask for confirmation"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        ids: list[str] = list(dict.fromkeys(options["result_ids"]))  # each once, in order
        with ops_errors():
            for result_id in ids:  # all checked before anything is written
                check_result_id(result_id)
        by = options["by"] if options["by"] is not None else _os_user()
        confirm(options, f"Cancel {len(ids)} task(s): {', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}?")
        unknown = 0
        for result_id in ids:
            with ops_errors():
                outcome = cancel_task(result_id, by=by)
            logger.info("queue_cancel_task id=%s outcome=%s by=%s", result_id, outcome.value, by or "-")
            self.stdout.write(f"{result_id}: {SAID[outcome]}")
            unknown += outcome is CancelOutcome.UNKNOWN
        if unknown:
            raise CommandError(f"{unknown} of {len(ids)} id(s) name no task.")


def _os_user() -> str:
    try:
        return f"{getpass.getuser()} (manage.py queue_cancel_task)"
    except (KeyError, OSError):  # no user name in this environment
        return "manage.py queue_cancel_task"

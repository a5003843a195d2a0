"""The Tasks tab: results of the ``django.tasks`` backend, a task's page, retry and cancel,
batches and recurring schedules. The queries are ``ops/tasks.py`` and ``ops/task_extras.py``;
cancelling is ``ops/task_cancel.py`` (shared with ``queue_cancel_task`` and ``tasks.cancel``)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.http.response import Http404
from django.utils.http import urlencode

from ..exceptions import SQLQueueError
from ..ops import OperationError, task_cancel, task_extras, waiting_tasks
from ..ops import tasks as task_ops
from .auditing import audit_batches
from .base import Console, audit, clip, confirmed, fail, flash, pretty, preview, require, require_action, url

#: What the console says of each outcome of a cancel: (flash level, text), audited when it changed something.
CANCEL_OUTCOMES = {
    "cancelled": (messages.SUCCESS, "Cancelled task {id}: it will not run; its result is FAILED (TaskCancelled)."),
    "requested": (
        messages.WARNING,
        "Task {id} is running: its cancel flag is set. It stops if it checks the flag; otherwise it runs to its end.",
    ),
    "finished": (messages.WARNING, "Task {id} had finished already: nothing was changed."),
    "unknown": (messages.ERROR, "No task has the id {id}: nothing was changed."),
}


def _task_url(result_id: str) -> str:
    return url("task", result_id)


class TaskPages(Console):
    def tasks(self, request: HttpRequest) -> HttpResponse:
        require(request)
        g = request.GET
        if g.get("id"):
            return HttpResponseRedirect(_task_url(g["id"]))
        page, error, f = None, None, task_ops.TaskFilter()
        try:
            f = task_ops.TaskFilter(
                status=g.get("status") or None, queue=g.get("queue") or None, task=g.get("task") or None
            )
            page = task_ops.list_tasks(f, cursor=g.get("cursor") or None, limit=50)
        except SQLQueueError as exc:
            error = str(exc)
        return self.render(
            request,
            "tasks.html",
            {
                "page": page,
                "rows": [(t, clip(t.errors[-1].get("traceback", "")) if t.errors else "") for t in page.items]
                if page
                else [],
                "filter": g,
                "qs": urlencode(f.as_query()),
                "error": error,
                "statuses": task_ops.STATUSES,
                "sub": "results",
            },
            tab="tasks",
            title="Tasks",
        )

    def task(self, request: HttpRequest, result_id: str) -> HttpResponse:
        require(request)
        try:
            t = task_ops.get_task(result_id)
        except task_ops.NotFound as exc:
            raise Http404(str(exc)) from exc
        batch = None
        if t.batch_id:
            try:
                batch = task_extras.get_batch(t.batch_id)
            except task_ops.NotFound:
                batch = None
        attempts = [(n, w) for n, w in enumerate(t.worker_ids, 1)]
        return self.render(
            request,
            "task.html",
            {
                "t": t,
                "args": pretty(t.args),
                "kwargs": pretty(t.kwargs),
                "return_value": pretty(t.return_value),
                "size": preview([t.args, t.kwargs]).size,
                "attempts": attempts,
                "batch": batch,
                "batch_progress": task_extras.progress(batch) if batch else 0,
                "sub": "results",
            },
            tab="tasks",
            title=f"Task {t.id}",
        )

    def task_action(self, request: HttpRequest) -> HttpResponse:
        action = request.POST.get("action", "")
        if action not in ("retry", "cancel"):
            require_action(request, "retry_task")
            flash(request, messages.ERROR, f"unknown action {action!r}.")
            return HttpResponseRedirect(url("tasks"))
        require_action(request, f"{action}_task")
        result_id = request.POST.get("id", "")
        back = _task_url(result_id) if result_id else url("tasks")
        try:
            task = task_ops.get_task(result_id)
            if not confirmed(request):
                return self._confirm_task(request, action, task, back)
            if action == "retry":
                return self._retry(request, task, back)
            return self._cancel(request, task, back)
        except SQLQueueError as exc:
            fail(request, exc)
            # No such task (any more): back to the list, its page would be a 404.
            gone = isinstance(exc, task_ops.NotFound) or not isinstance(exc, OperationError)
            return HttpResponseRedirect(url("tasks") if gone else back)

    def _confirm_task(self, request: HttpRequest, action: str, t: task_ops.TaskDetail, back: str) -> HttpResponse:
        what = f"task {t.id} ({t.task_path}, {t.shown_status})"
        if action == "retry":
            return self.confirm(
                request,
                tab="tasks",
                title=f"Retry task {t.id}?",
                summary=f"Run {what} again.",
                details=[
                    (
                        "Its dead letter is replayed to the task queue: the result goes back to READY and the new "
                        "attempts are added to it (its earlier errors are kept)."
                    ),
                    "One transaction; a second retry finds no dead letter and does nothing.",
                ],
                danger=False,
                back=back,
            )
        return self.confirm(
            request,
            tab="tasks",
            title=f"Cancel task {t.id}?",
            summary=f"Cancel {what}.",
            details=[
                "A task that has not started never runs: its result becomes FAILED with TaskCancelled.",
                "A running task only gets its cancel flag set: it stops if it checks the flag.",
            ],
            back=back,
        )

    def _retry(self, request: HttpRequest, t: task_ops.TaskDetail, back: str) -> HttpResponse:
        target = f"task {t.id}"
        # The LogEntry is written inside the replay's transaction (console/auditing.py).
        on_batch = audit_batches(request, target, lambda r: f"Retried {target} ({t.task_path}): {r.describe()}")
        result = task_ops.retry_task(t.id, actor=request.user.get_username(), on_batch=on_batch)
        if result.done:
            flash(request, messages.SUCCESS, f"Retried task {t.id}: it is READY and runs again.")
        else:
            flash(request, messages.WARNING, f"Task {t.id} was retried already (or its dead letter purged).")
        return HttpResponseRedirect(back)

    def _cancel(self, request: HttpRequest, t: task_ops.TaskDetail, back: str) -> HttpResponse:
        outcome = task_cancel.cancel_task(t.id, by=request.user.get_username())
        level, text = CANCEL_OUTCOMES.get(outcome.value, (messages.WARNING, "Task {id}: " + outcome.value + "."))
        message = text.format(id=t.id)
        if outcome.value in ("cancelled", "requested"):
            audit(request, f"task {t.id}", f"{message} ({t.task_path}; outcome {outcome.name}).")
        flash(request, level, message)
        return HttpResponseRedirect(back)

    def waiting(self, request: HttpRequest) -> HttpResponse:
        """Tasks no worker started (no result row): read from the log (``ops/waiting_tasks.py``)."""
        require(request)
        g = request.GET
        order = g.get("order") or "oldest"
        page, error = None, None
        try:
            page = waiting_tasks.list_waiting(order=order, cursor=g.get("cursor") or None, limit=50)
        except SQLQueueError as exc:
            error = str(exc)
        return self.render(
            request,
            "task_waiting.html",
            {"page": page, "order": order, "qs": urlencode({"order": order}), "error": error, "sub": "waiting"},
            tab="tasks",
            title="Waiting tasks",
        )

    def batches(self, request: HttpRequest) -> HttpResponse:
        require(request)
        g = request.GET
        page, error = None, None
        unfinished = g.get("unfinished") == "1"
        try:
            page = task_extras.list_batches(unfinished=unfinished, cursor=g.get("cursor") or None, limit=50)
        except SQLQueueError as exc:
            error = str(exc)
        return self.render(
            request,
            "task_batches.html",
            {
                "rows": [(b, task_extras.progress(b)) for b in page.items] if page else [],
                "page": page,
                "qs": "unfinished=1" if unfinished else "",
                "filter": g,
                "error": error,
                "sub": "batches",
            },
            tab="tasks",
            title="Task batches",
        )

    def schedules(self, request: HttpRequest) -> HttpResponse:
        require(request)
        now, error = None, None
        rows: list[task_extras.ScheduleInfo] = []
        try:
            now, rows = task_extras.list_schedules()
        except SQLQueueError as exc:
            error = str(exc)
        return self.render(
            request,
            "task_schedules.html",
            {"now": now, "rows": rows, "error": error, "sub": "schedules"},
            tab="tasks",
            title="Recurring schedules",
        )

"""``SQLQueueBackend``: the ``django.tasks`` backend whose queues are topics.

Mapping (see docs/tasks.md):

- queue ``<name>`` of backend alias ``default`` is topic ``tasks.<name>``; of another
  alias ``<alias>``, topic ``tasks.<alias>.<name>`` (``OPTIONS["TOPIC_PREFIX"]`` changes
  the ``tasks.`` / ``tasks.<alias>.`` part);
- the task is run by consumer group ``tasks`` (``OPTIONS["GROUP"]``) of ``runconsumer``;
- the TaskResult id is the message id, so ``enqueue`` is a ``publish()`` and joins the
  caller's transaction; ``run_after`` is the message's ``deliver_at``;
- failed tasks are the dead letters of the topic (``tasks.<name>_dlq``);
- a worker runs only the tasks ``trust.py`` vouches for (declared for this backend, in a
  module it may look up); ``enqueue`` refuses the others, which a worker would refuse.

Priorities are refused (``supports_priority = False``: ``validate_task`` raises
``InvalidTask`` for a priority other than the default), as the contract asks of a backend
that does not order by priority: messages of a partition are delivered in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import tracing
from ..conf import get_settings
from ..consumers import DEFAULT
from ..exceptions import ConfigurationError, InvalidMessage
from ..publisher import publish_message
from ..rules import dlq
from ..rules.atomic_modes import validate_atomic
from ..rules.validation import validate_group, validate_message_id, validate_publish_topic, validate_topic
from .compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .keys import current_key
from .lookup import load_result
from .marks import DEFAULT_MARK_RUNNING_AFTER
from .replay import replay_task
from .timeouts import parse_timeout
from .trust import UntrustedTask, trusted_task

#: Keys of ``OPTIONS``.
OPTION_KEYS = frozenset(
    {
        "TOPIC_PREFIX",
        "GROUP",
        "MAX_ATTEMPTS",
        "VISIBILITY_TIMEOUT",
        "TIMEOUT",
        "ATOMIC",
        "BATCH_SIZE",
        "STRICT",
        "RESULT_RETENTION",
        "MARK_RUNNING_AFTER",
    }
)
#: Days finished results are kept by ``manage.py queue_prune_task_results`` by default.
DEFAULT_RESULT_RETENTION = 7 * 24 * 3600.0


@dataclass(frozen=True)
class BackendOptions:
    topic_prefix: str
    group: str
    max_attempts: int | None
    visibility_timeout: float | None
    batch_size: int | None
    result_retention: float
    #: ``OPTIONS["TIMEOUT"]``: seconds, None (no limit), a dict of those by queue name, or
    #: DEFAULT (the visibility timeout); see ``tasks/timeouts.py``.
    timeout: Any = DEFAULT
    #: ``OPTIONS["ATOMIC"]``: True, False, "batch", or a dict of those by queue name: a
    #: task's effects and its result row commit with its ack (``atomic.py``).
    atomic: Any = False
    #: ``OPTIONS["MARK_RUNNING_AFTER"]``: seconds a first attempt runs before its result row
    #: is written RUNNING (``tasks/marks.py``); 0: written as the task starts.
    mark_running_after: float = DEFAULT_MARK_RUNNING_AFTER

    def atomic_for_queue(self, queue_name: str) -> bool | str:
        """The consumer ``atomic`` option of one queue."""
        if isinstance(self.atomic, dict):
            return self.atomic.get(queue_name, False)
        return self.atomic

    def timeout_for_queue(self, queue_name: str) -> Any:
        """The consumer ``timeout`` of one queue (a number, None, or DEFAULT)."""
        if isinstance(self.timeout, dict):
            return self.timeout.get(queue_name, DEFAULT)
        return self.timeout


def parse_options(alias: str, options: Any) -> BackendOptions:
    """Validate ``TASKS[alias]["OPTIONS"]``; raise ConfigurationError naming the problem."""
    where = f"TASKS[{alias!r}]['OPTIONS']"
    if not isinstance(options, dict):
        raise ConfigurationError(f"{where} must be a dict, not {type(options).__name__}.")
    unknown = sorted(set(options) - OPTION_KEYS)
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown key(s): {', '.join(map(str, unknown))}; known: {', '.join(sorted(OPTION_KEYS))}."
        )
    prefix = options.get("TOPIC_PREFIX", "tasks." if alias == "default" else f"tasks.{alias}.")
    group = options.get("GROUP", "tasks")
    try:
        validate_topic(f"{prefix}x", what=f"{where}['TOPIC_PREFIX'] + queue name")
        validate_group(group)
    except InvalidMessage as exc:
        raise ConfigurationError(f"{where}: {exc}") from exc

    def positive(key: str, kind: type) -> Any:
        value = options.get(key)
        if value is None:
            return None
        ok = isinstance(value, int) if kind is int else isinstance(value, (int, float))
        if not ok or isinstance(value, bool) or value <= 0:
            raise ConfigurationError(f"{where}[{key!r}] must be a positive {kind.__name__}, got {value!r}.")
        return kind(value)

    strict = options.get("STRICT", False)
    if not isinstance(strict, bool):
        raise ConfigurationError(f"{where}['STRICT'] must be True or False, got {strict!r}.")
    batch_size = positive("BATCH_SIZE", int)
    if strict:
        if batch_size not in (None, 1):
            raise ConfigurationError(f"{where}: STRICT means one task of a key at a time (BATCH_SIZE 1).")
        batch_size = 1
    retention = positive("RESULT_RETENTION", float)
    mark_after = options.get("MARK_RUNNING_AFTER", DEFAULT_MARK_RUNNING_AFTER)
    if not isinstance(mark_after, (int, float)) or isinstance(mark_after, bool) or not 0 <= mark_after < float("inf"):
        raise ConfigurationError(f"{where}['MARK_RUNNING_AFTER'] must be a number of seconds >= 0, got {mark_after!r}.")
    return BackendOptions(
        topic_prefix=prefix,
        group=group,
        max_attempts=positive("MAX_ATTEMPTS", int),
        visibility_timeout=positive("VISIBILITY_TIMEOUT", float),
        batch_size=batch_size,
        result_retention=DEFAULT_RESULT_RETENTION if retention is None else retention,
        timeout=parse_timeout(f"{where}['TIMEOUT']", options["TIMEOUT"]) if "TIMEOUT" in options else DEFAULT,
        atomic=_parse_atomic(f"{where}['ATOMIC']", options.get("ATOMIC", False)),
        mark_running_after=float(mark_after),
    )


def _parse_atomic(where: str, value: Any) -> Any:
    """Validate ``OPTIONS["ATOMIC"]``: True, False, "batch", or a dict of those by queue name."""
    if isinstance(value, dict):
        return {queue: validate_atomic(atomic, f"{where}[{queue!r}]") for queue, atomic in value.items()}
    return validate_atomic(value, where)


class SQLQueueBackend(BaseTaskBackend):
    """Tasks as messages: transactional enqueue, retries, dead letters, results, ordering keys."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.sqlqueue = parse_options(alias, self.options)
        if not self.queues:
            raise ConfigurationError(f"TASKS[{alias!r}]['QUEUES'] must name at least one queue.")
        # Validates each queue name as part of a topic; kept: a worker asks for every message.
        self._topics = {name: self.topic_for(name) for name in sorted(self.queues)}
        for key, value in (("TIMEOUT", self.sqlqueue.timeout), ("ATOMIC", self.sqlqueue.atomic)):
            unknown = sorted(set(value) - set(self.queues)) if isinstance(value, dict) else []
            if unknown:
                raise ConfigurationError(
                    f"TASKS[{alias!r}]['OPTIONS'][{key!r}] names queue(s) not in QUEUES: "
                    f"{', '.join(map(str, unknown))}."
                )
        # apps.py registers it too when TASKS names this backend; also here for a backend
        # configured otherwise (a settings override, a backend built by hand). Idempotent.
        dlq.register_replay_hook(replay_task)

    # -- mapping ---------------------------------------------------------------------------

    def topic_for(self, queue_name: str) -> str:
        """The topic of ``queue_name``: ``<TOPIC_PREFIX><queue_name>``."""
        topic = f"{self.sqlqueue.topic_prefix}{queue_name}"
        try:
            validate_topic(topic, what=f"topic {topic!r} of task queue {queue_name!r}")
            # A queue's topic must be one publish() may write: not a dead-letter topic.
            return validate_publish_topic(topic, get_settings().DLQ_SUFFIX)
        except InvalidMessage as exc:
            raise ConfigurationError(f"TASKS[{self.alias!r}]: {exc}") from exc

    def topics(self) -> dict[str, str]:
        """Queue name -> topic, for every queue of the backend."""
        return dict(self._topics)

    def dead_letter_topic(self, queue_name: str) -> str:
        """Return the dead-letter topic of ``queue_name`` (where its failed tasks are)."""
        return get_settings().dlq_topic(self.topic_for(queue_name))

    def dead_letter_id(self, result_id: str) -> str:
        """Return the id of the dead letter of the failed task ``result_id``."""
        return dlq.dead_letter_id(self.sqlqueue.group, result_id)

    # -- contract --------------------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        try:
            validate_publish_topic(f"{self.sqlqueue.topic_prefix}{task.queue_name}", get_settings().DLQ_SUFFIX)
        except InvalidMessage as exc:
            raise InvalidTask(f"queue name {task.queue_name!r} cannot be a topic: {exc}") from exc

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Publish the task in the caller's transaction; ``task_enqueued`` fires on commit."""
        return self.enqueue_with(task, args, kwargs)

    def enqueue_with(self, task: Task, args: Any, kwargs: Any, *, id: str | None = None, key: Any = None) -> TaskResult:
        """:meth:`enqueue` with a chosen result id (idempotent: the same id is stored once)
        and ordering key (default: the enclosing ``ordering_key()`` block's)."""
        self.validate_task(task)
        # Refuse here what a worker would refuse (trust.py): e.g. a task declared for another
        # backend and moved to this one with .using(backend=...).
        try:
            trusted_task(task.module_path, alias=self.alias, queues=self.queues, queue_name=task.queue_name)
        except UntrustedTask as exc:
            raise InvalidTask(f"{exc}; a worker of this backend would refuse it.") from exc
        # Without a chosen id the message's fresh random id is the result id: a new id needs
        # no look-up for an earlier publish, so the enqueue is one INSERT.
        result_id = validate_message_id(id) if id is not None else None
        # The contract's JSON round trip (tuples become lists; other types raise TypeError).
        args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        payload = {
            "task": task.module_path,
            "args": args,
            "kwargs": kwargs,
            "backend": self.alias,
            "queue_name": task.queue_name,
        }
        published = publish_message(
            self.topic_for(task.queue_name),
            payload,
            key=current_key() if key is None else key,
            id=result_id,
            deliver_at=task.run_after,
            metadata={"task": task.module_path},
            # The send span (when a span is active: tracing.py) names the task.
            span_attributes={tracing.TASK_NAME: task.module_path},
        )
        result: TaskResult = TaskResult(
            task=task,
            id=published.id,
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        # Like the message itself, the signal exists only if the caller's transaction commits.
        transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result), using=get_settings().DATABASE)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's state: from its result row once a worker started it, else from its message."""
        return load_result(self, result_id)

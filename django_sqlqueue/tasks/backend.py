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
  module it may look up); ``enqueue`` refuses the others, which a worker would refuse;
- a task may have fewer attempts than the backend's (``attempts.py``);
- a ``@unique`` task is enqueued once while an equal one counts (``uniqueness.py``).

Mistakes in ``TASKS`` (``options.py``) do not raise when the backend is built -- Django
builds it when a ``@task`` is declared, so that would be an import traceback -- but are
reported by :meth:`SQLQueueBackend.check` (``manage.py check``) and raised, in one line,
when the backend is used.

Priorities: each level listed in ``OPTIONS["PRIORITIES"]`` is a topic of its own,
``tasks.<name>.p<level>`` (level 0 is the queue's topic), polled highest first
(``priorities.py``); ``validate_task`` refuses a priority with no level.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.core import checks
from django.db import transaction
from django.utils import timezone

from .. import tracing
from ..conf import get_settings
from ..exceptions import ConfigurationError, InvalidMessage
from ..publisher import publish_message
from ..rules import dlq
from ..rules.validation import validate_message_id, validate_publish_topic, validate_topic
from .app_missing import app_missing, app_missing_error
from .attempts import max_attempts_of
from .batch_members import batch_fields, joined
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
from .options import (
    INVALID_SETTING,
    BackendOptions,
    Problem,
    TaskBackendMisconfigured,
    check_queue_options,
    configuration_problems,
    parse_options,
)
from .priorities import DEFAULT_PRIORITY, level_topic
from .priorities import refusal as priority_refusal
from .replay import replay_task
from .trust import UntrustedTask, trusted_task
from .uniqueness import enqueue_unique, unique_of

__all__ = ["BackendOptions", "SQLQueueBackend", "parse_options"]


class SQLQueueBackend(BaseTaskBackend):
    """Tasks as messages: transactional enqueue, retries, dead letters, results, ordering keys."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Django builds a backend when a @task is declared (an import) or first used: a
        # mistake in its settings is recorded here, reported by check() and raised on use
        # (TaskBackendMisconfigured, one line), not raised from an import.
        self._options: BackendOptions | None = None
        self._topics: dict[str, str] = {}
        self.problems: list[Problem] = configuration_problems(alias, self.options)
        if not self.problems:
            try:
                options = parse_options(alias, self.options)
                check_queue_options(alias, options, self.queues)
                # Validates each queue name as part of a topic; kept: a worker asks for every message.
                self._topics = {name: self._topic(options, name) for name in sorted(self.queues)}
                self._refuse_routed_topics(options)
            except ConfigurationError as exc:
                self.problems.append(Problem(INVALID_SETTING, str(exc)))
            else:
                self._options = options
        # apps.py registers it too when TASKS names this backend; also here for a backend
        # configured otherwise (a settings override, a backend built by hand). Idempotent.
        dlq.register_replay_hook(replay_task)

    @property
    def sqlqueue(self) -> BackendOptions:
        """The parsed ``OPTIONS``; raise TaskBackendMisconfigured if the settings have a problem."""
        if self._options is None:
            first, more = self.problems[0], len(self.problems) - 1
            hint = f" {first.hint}" if first.hint else ""
            rest = f" ({more} more: manage.py check lists them)" if more else ""
            raise TaskBackendMisconfigured(f"{first.msg}{hint}{rest}")
        return self._options

    def ensure_configured(self) -> None:
        """Raise TaskBackendMisconfigured (one line) if the backend's settings have a problem."""
        self.sqlqueue  # noqa: B018 - the property raises it

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """The backend's system checks (run by ``manage.py check``): its settings, and the app."""
        messages = list(super().check(**kwargs))
        if app_missing():  # (the package then hands out app_missing.py's stand-in instead)
            messages.append(app_missing_error(self.alias))
        messages += [checks.Error(p.msg, hint=p.hint, id=p.id) for p in self.problems]
        return messages

    # -- mapping ---------------------------------------------------------------------------

    def topic_for(self, queue_name: str, priority: int = DEFAULT_PRIORITY) -> str:
        """The topic of ``queue_name``'s tasks of ``priority``: ``<TOPIC_PREFIX><queue_name>``
        for the default priority, else that level's (``priorities.py``)."""
        return level_topic(self._topic(self.sqlqueue, queue_name), priority)

    def queue_levels(self) -> list[tuple[str, int, str]]:
        """(queue name, priority level, topic) for every queue and level, highest level first."""
        levels = self.sqlqueue.priorities
        return [(name, level, level_topic(base, level)) for name, base in self.topics().items() for level in levels]

    def _topic(self, options: BackendOptions, queue_name: str) -> str:
        topic = f"{options.topic_prefix}{queue_name}"
        try:
            validate_topic(topic, what=f"topic {topic!r} of task queue {queue_name!r}")
            # A queue's topic must be one publish() may write: not a dead-letter topic.
            return validate_publish_topic(topic, get_settings().DLQ_SUFFIX)
        except InvalidMessage as exc:
            raise ConfigurationError(f"TASKS[{self.alias!r}]: {exc}") from exc

    def _refuse_routed_topics(self, options: BackendOptions) -> None:
        """Raise ConfigurationError if ``SQLQUEUE["TOPIC_DATABASES"]`` routes a queue's topic away
        from ``SQLQUEUE["DATABASE"]``: the results, uniqueness claims and batches live there, and
        an enqueue writes them in one transaction with the message."""
        conf = get_settings()
        for name, base in self._topics.items():
            for level in options.priorities:
                topic = level_topic(base, level)
                routed = conf.database_for(topic)
                if routed != conf.DATABASE:
                    raise ConfigurationError(
                        f"TASKS[{self.alias!r}]: the topic {topic!r} of task queue {name!r} is routed to database "
                        f"{routed!r} by SQLQUEUE['TOPIC_DATABASES'], but a task's message must live with its result "
                        f"in SQLQUEUE['DATABASE'] ({conf.DATABASE!r}): narrow the pattern so that it leaves "
                        f"{topic!r} out (task topics start with {options.topic_prefix!r})."
                    )

    def topics(self) -> dict[str, str]:
        """Queue name -> topic, for every queue of the backend."""
        self.ensure_configured()
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
        if self._options is None:
            # Called as @task declares a task (an import): the settings' problem is for
            # check() to report and enqueue() to raise, not for an import traceback.
            return
        try:
            validate_publish_topic(f"{self._options.topic_prefix}{task.queue_name}", get_settings().DLQ_SUFFIX)
        except InvalidMessage as exc:
            raise InvalidTask(f"queue name {task.queue_name!r} cannot be a topic: {exc}") from exc
        if task.priority not in self._options.priorities:
            raise InvalidTask(priority_refusal(self.alias, task.priority, self._options.priorities))
        own, allowed = max_attempts_of(task), self.max_attempts()
        if own is not None and own > allowed:
            raise InvalidTask(
                f"task {task.module_path} asks for task_max_attempts({own}), more than the {allowed} attempts of "
                f"backend {self.alias!r} (its OPTIONS['MAX_ATTEMPTS'], else SQLQUEUE['MAX_ATTEMPTS']): "
                "raise the backend's, or ask for fewer."
            )

    def max_attempts(self) -> int:
        """The attempts of a task of this backend: ``OPTIONS["MAX_ATTEMPTS"]``, else ``SQLQUEUE["MAX_ATTEMPTS"]``."""
        return self.sqlqueue.max_attempts or get_settings().MAX_ATTEMPTS

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Publish the task in the caller's transaction; ``task_enqueued`` fires on commit."""
        return self.enqueue_with(task, args, kwargs)

    def enqueue_with(self, task: Task, args: Any, kwargs: Any, *, id: str | None = None, key: Any = None) -> TaskResult:
        """:meth:`enqueue` with a chosen result id (idempotent: the same id is stored once)
        and ordering key (default: the enclosing ``ordering_key()`` block's)."""
        self.ensure_configured()
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
        payload.update(batch_fields(self.alias))  # in a batch() block: {"batch": its id} (batches.py)
        publish = partial(
            publish_message,
            self.topic_for(task.queue_name, task.priority),
            payload,
            key=current_key() if key is None else key,
            deliver_at=task.run_after,
            metadata={"task": task.module_path},
            # The send span (when a span is active: tracing.py) names the task.
            span_attributes={tracing.TASK_NAME: task.module_path},
        )
        spec = unique_of(task)
        if spec is None:
            published = publish(id=result_id)
        else:
            # A unique task (uniqueness.py): its claim and message in one transaction, or the
            # existing task's result for a duplicate (nothing written, no signal).
            outcome = enqueue_unique(self, task, spec, args, kwargs, id=result_id, publish=publish)
            if isinstance(outcome, TaskResult):
                return outcome
            published = outcome
        joined(payload)  # counted in its batch, if any
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
        self.ensure_configured()
        return load_result(self, result_id)

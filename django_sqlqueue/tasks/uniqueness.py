"""Unique tasks: :func:`unique` makes ``enqueue()`` of a task a no-op while an equal one counts.

::

    from django.tasks import task
    from django_sqlqueue.tasks import unique

    @task()
    @unique(keys=("user_id",), period=300, states=("waiting", "running", "finished"))
    def send_digest(user_id, day): ...

A task's identity is its backend alias, its path and the values of ``keys`` (argument
names; default: every argument), hashed into ``lock_key``, the primary key of its claim
row in ``queue_task_unique``. ``enqueue()`` of a task whose claim counts -- its task is
in one of ``states`` and the claim is younger than ``period`` -- returns that task's
``TaskResult`` and writes nothing (no message, no signal).

**Why one task, however many transactions race** (docs/tasks.md, "Unique tasks"): the
claim row is INSERTed in the caller's transaction, with the task's message (the outbox:
both exist exactly when the caller commits), and the primary key lets one INSERT of a
``lock_key`` succeed; a concurrent one waits for the first transaction and then fails
(a duplicate: its task is the winner's) or, if the first rolled back, succeeds. The
plain read before the INSERT only saves the INSERT (and, on InnoDB, the shared lock a
failed INSERT keeps until commit) when a committed claim exists; it decides nothing.
A claim that no longer counts is taken over by a compare-and-set UPDATE (``WHERE
lock_key = k AND result_id = <the one judged stale>``): of concurrent takers one
updates the row, the others update nothing (their WHERE no longer matches once the
winner commits) and read the claim again.

In the caller's transaction the INSERT runs in a savepoint, so a duplicate leaves the
transaction usable (PostgreSQL aborts a transaction on an error). Outside one, the
claim and the message get a transaction of their own, retried when a concurrent claim
or a deadlock (InnoDB, below) rolled it back.

Claims of different keys never wait on each other (one row each, no range read);
same-key enqueues wait for the transaction that holds the key, which is inherent. The
InnoDB trap -- the holder rolls back while two others wait in the INSERT's duplicate
check: their shared locks turn into gap locks, the two deadlock (MySQL rolls back the
victim's WHOLE transaction) and other keys' inserts into the gap wait -- is avoided by
waiting in a locking read before the INSERT instead (see :func:`_claim`). A deadlock
that still happens outside a transaction is retried here.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import inspect
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import IntegrityError, OperationalError, transaction
from django.db.models import Q
from django.utils import timezone

from ..conf import get_settings
from ..db.retry import is_transient
from ..exceptions import ConfigurationError, SQLQueueError
from ..rules.validation import new_message_id
from ..task_models import TaskResultRecord, TaskUniqueLock
from .compat import InvalidTask, Task, TaskResult, TaskResultDoesNotExist, TaskResultStatus, normalize_json
from .lookup import load_result
from .results import FINISHED

if TYPE_CHECKING:
    from ..db.store.messages import PublishedMessage
    from .backend import SQLQueueBackend

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute :func:`unique` sets on the task's function.
ATTRIBUTE = "_sqlqueue_unique"
#: The states a claim may count in: not started (also scheduled, or waiting for a retry),
#: running, finished (SUCCESSFUL or FAILED; needs a ``period``).
STATES = ("waiting", "running", "finished")
DEFAULT_STATES = ("waiting", "running")
_STATE_OF = {
    TaskResultStatus.READY: "waiting",
    TaskResultStatus.RUNNING: "running",
    TaskResultStatus.SUCCESSFUL: "finished",
    TaskResultStatus.FAILED: "finished",
}
#: Rounds of insert / read / take over before giving up (each lost round means another
#: transaction changed the claim meanwhile; a few are plenty).
ROUNDS = 20


class UniqueTaskContention(SQLQueueError):
    """The claim of a unique task kept changing under ``enqueue()`` (:data:`ROUNDS` rounds); nothing written."""


@dataclass(frozen=True)
class UniqueSpec:
    """What :func:`unique` asked for."""

    #: Argument names whose values identify the task (None: all arguments).
    keys: tuple[str, ...] | None
    #: Seconds after which a claim lapses whatever its task's state (None: never).
    period: float | None
    states: frozenset[str]


def unique(
    keys: Iterable[str] | None = None,
    period: float | dt.timedelta | None = None,
    states: Iterable[str] = DEFAULT_STATES,
) -> Callable[[F], F]:
    """Enqueue the task once while an equal one (same ``keys`` values) is in ``states``.

    Put it under ``@task`` (it marks the function ``@task`` wraps). Raise
    ``ConfigurationError`` at once for bad arguments.
    """
    spec = _spec(keys, period, states)

    def mark(fn: F) -> F:
        target = getattr(fn, "func", fn)  # a django.tasks Task: mark the function it runs
        _check_keys(target, spec)
        setattr(target, ATTRIBUTE, spec)
        return fn

    return mark


def _spec(keys: Iterable[str] | None, period: float | dt.timedelta | None, states: Iterable[str]) -> UniqueSpec:
    if isinstance(period, dt.timedelta):
        period = period.total_seconds()
    if period is not None and (
        not isinstance(period, (int, float)) or isinstance(period, bool) or not period > 0 or math.isinf(period)
    ):
        raise ConfigurationError(
            f"unique(period=...) takes a positive number of seconds, a timedelta or None, got {period!r}."
        )
    if isinstance(keys, str):
        raise ConfigurationError(f"unique(keys=...) takes a sequence of argument names, not the string {keys!r}.")
    key_names: tuple[str, ...] | None = None
    if keys is not None:
        key_names = tuple(keys)
        bad = [k for k in key_names if not isinstance(k, str) or not k.isidentifier()]
        if bad or not key_names or len(set(key_names)) != len(key_names):
            raise ConfigurationError(
                f"unique(keys=...) takes distinct argument names (at least one), got {keys!r}; "
                "leave it out to use every argument."
            )
    if isinstance(states, str):
        raise ConfigurationError(f"unique(states=...) takes a sequence of states, not the string {states!r}.")
    chosen = frozenset(states)
    if not chosen or not chosen <= set(STATES):
        raise ConfigurationError(f"unique(states=...) takes one or more of {', '.join(STATES)}, got {states!r}.")
    if "finished" in chosen and period is None:
        raise ConfigurationError(
            "unique(states=...) with 'finished' needs a period: a finished task counts only within it."
        )
    return UniqueSpec(keys=key_names, period=None if period is None else float(period), states=chosen)


def _check_keys(func: Callable[..., Any], spec: UniqueSpec) -> None:
    if spec.keys is None:
        return
    params = inspect.signature(func).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return  # any name may come through **kwargs
    missing = [k for k in spec.keys if k not in params or params[k].kind == params[k].VAR_POSITIONAL]
    if missing:
        raise ConfigurationError(
            f"unique(keys=...): {', '.join(missing)} is not an argument of {func.__qualname__} "
            f"(its arguments: {', '.join(params)})."
        )


def unique_of(task: Any) -> UniqueSpec | None:
    """The task's :func:`unique` spec, or None for a plain task."""
    value = getattr(getattr(task, "func", None), ATTRIBUTE, None)
    return value if isinstance(value, UniqueSpec) else None


def lock_key(alias: str, task: Task, spec: UniqueSpec, args: list[Any], kwargs: dict[str, Any]) -> str:
    """sha256 hex of the backend alias, the task path and the canonical JSON of the key values."""
    signature = inspect.signature(task.func)
    try:
        bound = signature.bind(*([None] if task.takes_context else []), *args, **kwargs)
    except TypeError as exc:
        raise InvalidTask(f"unique task {task.module_path}: its arguments do not fit its signature: {exc}") from exc
    bound.apply_defaults()
    values = dict(bound.arguments)
    if task.takes_context:
        values.pop(next(iter(signature.parameters)))
    for name, param in signature.parameters.items():
        if param.kind == param.VAR_KEYWORD and name in values:
            values |= values.pop(name)  # keyword arguments caught by **kwargs: by their own names
    if spec.keys is not None:
        missing = [k for k in spec.keys if k not in values]
        if missing:
            raise InvalidTask(f"unique task {task.module_path}: no value for its key argument(s) {', '.join(missing)}.")
        values = {k: values[k] for k in spec.keys}
    canonical = json.dumps(
        [alias, task.module_path, normalize_json(values)], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


# -- enqueue ---------------------------------------------------------------------------------


def enqueue_unique(
    backend: SQLQueueBackend,
    task: Task,
    spec: UniqueSpec,
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    id: str | None,
    publish: Callable[..., PublishedMessage],
) -> TaskResult | PublishedMessage:
    """Claim the task's key and ``publish(id=...)`` its message, in one transaction.

    Return the existing task's result for a duplicate (nothing written), else the message
    published.
    """
    key = lock_key(backend.alias, task, spec, args, kwargs)
    # The claim names the task's result id before its message exists: choose it now.
    result_id = id if id is not None else new_message_id()
    using = get_settings().DATABASE
    if transaction.get_connection(using).in_atomic_block:
        # The caller's transaction: claim and message commit or roll back with it.
        existing = _claim(backend, task, spec, key, result_id, in_savepoint=True)
        return existing if existing is not None else publish(id=result_id)
    for attempt in range(1, ROUNDS + 1):
        try:
            with transaction.atomic(using=using):
                existing = _claim(backend, task, spec, key, result_id, in_savepoint=False)
                return existing if existing is not None else publish(id=result_id)
        except IntegrityError:
            continue  # a concurrent claim of the key committed first: its task is read next round
        except OperationalError as exc:
            # InnoDB's victim of the rollback trap (module docstring): our own transaction, so again.
            if attempt == ROUNDS or not is_transient(exc)[0] or is_transient(exc)[1]:
                raise
    raise _contention(task)


def _claim(
    backend: SQLQueueBackend, task: Task, spec: UniqueSpec, key: str, result_id: str, *, in_savepoint: bool
) -> TaskResult | None:
    """Claim ``key`` for ``result_id`` (None) or return the task whose claim counts.

    ``in_savepoint``: the INSERT runs in a savepoint, its duplicate is handled here;
    otherwise its IntegrityError propagates (the caller rolls back and retries).
    """
    using = get_settings().DATABASE
    claims = TaskUniqueLock.objects.using(using)
    for _ in range(ROUNDS):
        now = timezone.now()
        expires = None if spec.period is None else now + dt.timedelta(seconds=spec.period)
        # A plain read (READ COMMITTED: the latest committed claim); it decides nothing.
        current = claims.filter(lock_key=key).values_list("result_id", "expires_at").first()
        if current is None:
            # No committed claim. A locking read waits for a transaction that inserted the
            # key and has not committed yet (READ COMMITTED: it locks nothing when there is
            # no row). Waiting here rather than in the INSERT's duplicate check matters on
            # InnoDB: the check's shared lock is inherited as a gap lock when that
            # transaction rolls back, which deadlocks two waiters and stalls inserts of
            # other keys into the gap; an exclusive lock of a locking read is not inherited.
            current = claims.select_for_update().filter(lock_key=key).values_list("result_id", "expires_at").first()
        if current is None:
            row = TaskUniqueLock(
                lock_key=key, result_id=result_id, task_path=task.module_path, created_at=now, expires_at=expires
            )
            if not in_savepoint:
                row.save(using=using, force_insert=True)
                return None
            try:
                with transaction.atomic(using=using):  # a savepoint: a duplicate leaves the caller's intact
                    row.save(using=using, force_insert=True)
                return None
            except IntegrityError:
                continue  # a concurrent claim committed while we waited on it: read it
        old_id, old_expires = current
        existing = _counting(backend, spec, old_id, old_expires, now)
        if existing is not None:
            return existing
        # Take the stale claim over, only as it was judged: compare-and-set on its result id.
        taken = claims.filter(lock_key=key, result_id=old_id).update(
            result_id=result_id, task_path=task.module_path, created_at=now, expires_at=expires
        )
        if taken == 1:
            return None
        # Another enqueue took it over (or pruned it) first: look again.
    raise _contention(task)


def _counting(
    backend: SQLQueueBackend, spec: UniqueSpec, result_id: str, expires_at: dt.datetime | None, now: dt.datetime
) -> TaskResult | None:
    """The claimed task's result if the claim counts (not expired, task in ``spec.states``)."""
    if expires_at is not None and expires_at <= now:
        return None
    try:
        result = load_result(backend, result_id)
    except TaskResultDoesNotExist:
        return None  # its message and result are gone (garbage-collected, pruned)
    return result if _STATE_OF.get(result.status) in spec.states else None


def _contention(task: Task) -> UniqueTaskContention:
    return UniqueTaskContention(
        f"unique task {task.module_path}: its claim changed under enqueue() {ROUNDS} times in a row; nothing written."
    )


# -- cleaning ----------------------------------------------------------------------------------


def prune_claims(*, dry_run: bool = False) -> int:
    """Delete claims that can no longer count: expired, or without a period and whose task
    finished. Each is deleted only as it was judged (compare-and-set on its result id), so a
    claim taken over meanwhile stays. Returns how many were (``dry_run``: would be) deleted."""
    using = get_settings().DATABASE
    claims = TaskUniqueLock.objects.using(using)
    finished = TaskResultRecord.objects.using(using).filter(status__in=[s.value for s in FINISHED]).values("id")
    stale = list(
        claims.filter(
            Q(expires_at__lte=timezone.now()) | Q(expires_at__isnull=True, result_id__in=finished)
        ).values_list("lock_key", "result_id")
    )
    if dry_run or not stale:
        return len(stale)
    deleted = 0
    for start in range(0, len(stale), 500):
        match = Q()
        for lock, result_id in stale[start : start + 500]:
            match |= Q(lock_key=lock, result_id=result_id)
        deleted += claims.filter(match).delete()[0]
    return deleted

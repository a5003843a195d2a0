"""Rate and concurrency limits of a task: :func:`rate_limit` and :func:`concurrency_limit`.

::

    from django.tasks import task
    from django_sqlqueue.tasks import concurrency_limit, rate_limit

    @task
    @rate_limit("20/s")                          # every worker together: 20 starts a second
    def call_partner_api(item_id): ...

    @task
    @rate_limit("5/m", key="customer_id")        # 5 a minute per customer
    @concurrency_limit(2, key="account_id")      # 2 at once per account
    def sync_account(account_id, customer_id): ...

Both mark the function ``@task`` wraps (put them under ``@task``; on top of it they mark
the task's function too), like :func:`~django_sqlqueue.tasks.task_timeout`. ``key`` is the
name of one of the function's parameters (its argument's ``str()`` is the key), or a
callable taking the task's arguments and returning the key; without ``key`` the limit is
one for the whole task.

The worker enforces them across all its processes through the database, just before it
runs the task (``worker/limits.py``). A task over its limit **waits**: it goes back to its
queue, due again when it could be admitted; that is not an attempt (its ``attempts``,
``errors`` and status do not change) and it holds up no other key or task. A rate is
``"<count>/<s|m|h>"`` with an optional ``burst`` (admissions allowed at once after a quiet
spell, default 1: every start spaced ``period / count`` apart), see ``rules/rates.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..exceptions import ConfigurationError
from ..rules.rates import Limits, Rate, limit_name, parse_concurrency, parse_rate

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute the decorators set on the task's function.
ATTRIBUTE = "_sqlqueue_limits"

Key = str | Callable[..., Any] | None


@dataclass(frozen=True)
class Declared:
    """A task function's limits as declared (keys not applied yet)."""

    rate: Rate | None = None
    rate_key: Key = None
    concurrency: int | None = None
    concurrency_key: Key = None


def rate_limit(rate: str, *, key: Key = None, burst: int = 1) -> Callable[[F], F]:
    """At most ``rate`` starts of the task (``"20/s"``, ``"5/m"``, ``"100/h"``) across every
    worker, per value of ``key`` if given; ``burst`` at once after a quiet spell."""
    parsed = parse_rate(rate, burst)
    _key_type(key, "rate_limit")

    def mark(fn: F) -> F:
        target = _target(fn)
        _check_key(target, key, "rate_limit")
        declared = _declared(target)
        if declared.rate is not None:
            raise ConfigurationError(f"{_name(target)} has a rate_limit already ({declared.rate.text!r}).")
        setattr(target, ATTRIBUTE, replace(declared, rate=parsed, rate_key=key))
        return fn

    return mark


def concurrency_limit(limit: int, *, key: Key = None) -> Callable[[F], F]:
    """At most ``limit`` runs of the task at once across every worker, per value of ``key`` if given."""
    n = parse_concurrency(limit)
    _key_type(key, "concurrency_limit")

    def mark(fn: F) -> F:
        target = _target(fn)
        _check_key(target, key, "concurrency_limit")
        declared = _declared(target)
        if declared.concurrency is not None:
            raise ConfigurationError(f"{_name(target)} has a concurrency_limit already ({declared.concurrency}).")
        setattr(target, ATTRIBUTE, replace(declared, concurrency=n, concurrency_key=key))
        return fn

    return mark


def limits_of(task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Limits | None:
    """The limits of one run of ``task`` with these arguments, or None (none declared: no cost).

    A key that cannot be found in the arguments (they do not match the function's
    signature) gives None: the task is run, and fails on its arguments as it would have.
    """
    func = getattr(task, "func", None)
    declared = getattr(func, ATTRIBUTE, None)
    if not isinstance(declared, Declared):
        return None
    path = getattr(task, "module_path", _name(func))
    if getattr(task, "takes_context", False):
        args = (None, *args)  # the context parameter comes first
    try:
        rates: tuple[tuple[str, Rate], ...] = ()
        if declared.rate is not None:
            rates = ((_limit_name("rate", path, declared.rate_key, func, args, kwargs), declared.rate),)
        concurrency = None
        if declared.concurrency is not None:
            name = _limit_name("concurrency", path, declared.concurrency_key, func, args, kwargs)
            concurrency = (name, declared.concurrency)
    except (TypeError, LookupError):
        return None
    return Limits(rates, concurrency)


def _limit_name(kind: str, path: str, key: Key, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    if key is None:
        return limit_name("task", kind, path)
    if callable(key):
        value = key(*args, **kwargs)
    else:
        value = inspect.signature(func).bind(*args, **kwargs).arguments[key]
    return limit_name("task", kind, path, str(value))


def _key_type(key: object, what: str) -> None:
    if key is not None and not callable(key) and not isinstance(key, str):
        raise ConfigurationError(f"{what}(key=...) takes a parameter name or a callable, got {key!r}.")


def _check_key(fn: Callable[..., Any], key: Key, what: str) -> None:
    """A key names a parameter of ``fn`` (or is a callable)."""
    if not isinstance(key, str):
        return
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to check against
        return
    parameter = parameters.get(key)
    if parameter is None or parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        raise ConfigurationError(
            f"{what}(key={key!r}): {_name(fn)} has no parameter {key!r} (it has {', '.join(parameters) or 'none'})."
        )


def _target(fn: Any) -> Any:
    """The function to mark: a django.tasks ``Task``'s function, or ``fn`` itself."""
    return getattr(fn, "func", fn)


def _declared(fn: Any) -> Declared:
    declared = getattr(fn, ATTRIBUTE, None)
    return declared if isinstance(declared, Declared) else Declared()


def _name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"

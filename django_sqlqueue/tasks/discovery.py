"""What ``runconsumer`` runs for the ``django.tasks`` backend: one consumer per task queue.

This module imports ``django.tasks`` (or the backport) only when ``settings.TASKS`` names
the backend, so projects without tasks need neither.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import autodiscover_modules

from ..consumers import ConsumerSpec

# Imported here, in ready() when TASKS names the backend: it registers the backend's checks.
from .checks import BACKEND_PATH, configured_aliases

__all__ = ["BACKEND_PATH", "configured_aliases", "task_consumer_specs"]


def task_consumer_specs() -> list[ConsumerSpec]:
    """A ConsumerSpec per queue of every configured backend; imports the apps' ``tasks`` modules
    (where ``@task`` functions and ``@recurring`` schedules are declared)."""
    aliases = configured_aliases()
    if not aliases:
        return []
    autodiscover_modules("tasks")
    from .compat import task_backends
    from .execution import handler_for

    specs = []
    for alias in aliases:
        backend: Any = task_backends[alias]
        opts = backend.sqlqueue
        max_attempts = backend.max_attempts()
        handler = handler_for(alias, max_attempts)
        # One consumer per queue and priority level (priorities.py): the worker polls a
        # queue's levels highest first (worker/bands.py); a queue with one level has none.
        levelled = len(opts.priorities) > 1
        for queue_name, level, topic in backend.queue_levels():
            specs.append(
                ConsumerSpec(
                    topic=topic,
                    group=opts.group,
                    handler=handler,
                    batch_size=opts.batch_size,
                    priority_band=(f"{alias}:{queue_name}", level) if levelled else None,
                    visibility_timeout=opts.visibility_timeout,
                    max_attempts=max_attempts,
                    timeout=opts.timeout_for_queue(queue_name),
                    timeout_for=handler.timeout_for,
                    limits_for=handler.limits_for,
                    on_timeout=handler.timed_out,
                    atomic=opts.atomic_for_queue(queue_name),
                    before_atomic=handler.begin_attempt,
                    on_rollback=handler.rolled_back,
                    settlement=handler.settlement,
                )
            )
    return specs

"""``manage.py runconsumer``: run registered consumers until SIGTERM/SIGINT, one worker per
database their topics live in (``worker/fleet.py``)."""

from __future__ import annotations

import os
import socket
from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError
from django.utils.module_loading import module_has_submodule

from django_sqlqueue.conf import QueueSettings, get_settings
from django_sqlqueue.consumers import ConsumerSpec, load_consumers, registry
from django_sqlqueue.exceptions import ConfigurationError, SQLQueueError, WorkerCrashed
from django_sqlqueue.rules.limits import SUBSCRIBER_NAME_LENGTH
from django_sqlqueue.schedules import all_schedules
from django_sqlqueue.tasks.discovery import BACKEND_PATH, configured_aliases, task_consumer_specs
from django_sqlqueue.worker.fleet import Fleet, plan, require_tables
from django_sqlqueue.worker.logsetup import configure_worker_logging
from django_sqlqueue.worker.shutdown import graceful_signals

from . import _args

CONCURRENCY = _args.bounded_int(1, _args.MAX_CONCURRENCY)


class Command(BaseCommand):
    help = (
        "Run the registered django-sqlqueue consumers (all, or those matching --group/--topic), one worker per "
        "database their topics live in (or per --database)."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> Any:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # None = -v not given: the project's LOGGING decides (django_sqlqueue.worker.logsetup).
        parser.set_defaults(verbosity=None)
        return parser

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--group", action="append", type=_args.group, default=[], help="consumer group to run (repeatable)"
        )
        parser.add_argument(
            "--topic", action="append", type=_args.topic, default=[], help="topic to consume (repeatable)"
        )
        parser.add_argument(
            "--database",
            action="append",
            type=_args.text(),
            default=[],
            metavar="ALIAS",
            help="serve only the consumers whose topics live in database ALIAS (repeatable; default: every "
            "database of SQLQUEUE['DATABASE'] and SQLQUEUE['TOPIC_DATABASES'], one worker each)",
        )
        parser.add_argument(
            "--name", type=_args.text(SUBSCRIBER_NAME_LENGTH), default=None, help="subscriber name (default: host:pid)"
        )
        parser.add_argument(
            "--no-schedules",
            action="store_true",
            help="do not fire recurring schedules from this worker (by default every worker helps; "
            "each tick fires once)",
        )
        parser.add_argument(
            "--concurrency",
            type=CONCURRENCY,
            default=1,
            help=f"handler threads, 1 to {_args.MAX_CONCURRENCY}: batches of different partitions run in parallel, "
            "order within a partition is kept (default 1: one handler at a time); each holds a database "
            "connection. A handler over its consumer's timeout is abandoned and its thread replaced; once more "
            "are stuck than this, the worker exits 1",
        )
        parser.add_argument(
            "--health-file",
            metavar="PATH",
            type=_args.text(),
            help="touch PATH (create it, update its mtime) after each healthy poll-loop round, at most once a "
            "second: a liveness probe checks its age (e.g. find PATH -mmin -1)",
        )

        parser.add_argument(
            "--metrics-port",
            type=int,
            metavar="N",
            help="serve this process's Prometheus counters and histograms (messages processed, failed, "
            "retried, dead-lettered, timed out; handler duration, batch size, polls, sequencer runs, leases) on "
            "http://ADDR:N/metrics "
            "(needs the 'prometheus' extra; see docs/observability.md)",
        )
        parser.add_argument(
            "--metrics-addr",
            default="0.0.0.0",
            metavar="ADDR",
            type=_args.text(),
            help="address --metrics-port listens on (default 0.0.0.0)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        health_file = options["health_file"]
        # Again for call_command(concurrency=...): a keyword skips the parser, and it starts threads.
        port = options["metrics_port"]
        if port is not None and not 0 < port < 65536:
            raise CommandError(f"--metrics-port must be a TCP port (1-65535), got {port}.")
        concurrency = _args.checked(options["concurrency"], "--concurrency", CONCURRENCY)
        if health_file is not None and not os.path.isdir(os.path.dirname(os.path.abspath(health_file))):
            raise CommandError(f"--health-file {health_file}: its directory does not exist.")
        configure_worker_logging(options["verbosity"])
        load_consumers()
        # The django.tasks backend's queues are consumers too (django_sqlqueue.tasks).
        for spec in task_consumer_specs():
            registry.register(spec)
        specs = registry.select(options["group"] or None, options["topic"] or None)
        if not registry.all():
            raise CommandError(no_consumers())
        if not specs:
            known = ", ".join(s.name for s in registry.all())
            raise CommandError(
                f"no registered consumer matches --group {options['group'] or '*'} --topic {options['topic'] or '*'}"
                f" (registered group:topic pairs: {known})."
            )
        name = options["name"] or f"{socket.gethostname()}:{os.getpid()}"
        try:
            conf = get_settings()
            schedules = [] if options["no_schedules"] else all_schedules(conf.SCHEDULES, conf.DLQ_SUFFIX)
        except SQLQueueError as exc:
            raise CommandError(str(exc)) from exc
        planned = self._plan(specs, conf, options["database"])
        try:
            require_tables(planned)
        except SQLQueueError as exc:
            raise CommandError(str(exc)) from exc
        metrics = self._start_metrics(port, options["metrics_addr"])
        try:
            try:
                fleet = Fleet.build(
                    planned,
                    name=name,
                    conf=conf,
                    concurrency=concurrency,
                    schedules=schedules,
                    health_file=health_file,
                    instruments=metrics,
                )
            except SQLQueueError as exc:  # e.g. a subscriber name the worker refuses
                raise CommandError(str(exc)) from exc
            with graceful_signals(fleet.stop):
                try:
                    fleet.run()
                except WorkerCrashed as exc:
                    # Exit non-zero so that a process manager restarts the worker.
                    raise CommandError(str(exc)) from exc
        finally:
            if metrics is not None:
                metrics.stop()

    def _plan(self, specs: list[ConsumerSpec], conf: QueueSettings, only: list[str]) -> dict[str, list[ConsumerSpec]]:
        """The consumers of each database to serve (``--database``: those named only)."""
        unknown = [alias for alias in only if alias not in conf.databases]
        if unknown:
            raise CommandError(
                f"--database {', '.join(unknown)}: not a database of the queue (known: {', '.join(conf.databases)}; "
                "SQLQUEUE['DATABASE'] and the aliases of SQLQUEUE['TOPIC_DATABASES'])."
            )
        planned = plan(specs, conf, only or None)
        if not planned:
            where = {spec.name: conf.database_for(spec.topic) for spec in specs}
            raise CommandError(
                f"no selected consumer has its topic in database {', '.join(only)} "
                f"(they live in: {', '.join(f'{n} -> {a}' for n, a in where.items())})."
            )
        return planned

    def _start_metrics(self, port: int | None, addr: str) -> Any:
        """Serve the worker's metrics on ``addr:port`` (receivers connected only then); None without a port."""
        if port is None:
            return None
        from django_sqlqueue.metrics.worker import WorkerMetrics

        try:
            metrics = WorkerMetrics()
            metrics.start(port, addr)
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        except OSError as exc:
            raise CommandError(f"--metrics-port {port}: cannot listen on {addr}:{port}: {exc}") from exc
        return metrics


def no_consumers() -> str:
    """Say where a worker looked for consumers and how to declare one (it found none)."""
    modules = [
        f"{c.name}.consumers"
        for c in apps.get_app_configs()
        # Not this app's own: django_sqlqueue.consumers is the @consumer decorator's module.
        if c.name != "django_sqlqueue" and module_has_submodule(c.module, "consumers")
    ]
    looked = f"imported {', '.join(modules)}" if modules else "found none in INSTALLED_APPS"
    tasks = f"TASKS aliases {', '.join(configured_aliases())}" if configured_aliases() else "none configured"
    return (
        f"no consumer to run: consumers are the @consumer functions of each installed app's `consumers` module "
        f"({looked}) and the queues of a TASKS backend {BACKEND_PATH!r} ({tasks}). Declare one in "
        "<app>/consumers.py of an app in INSTALLED_APPS: `@consumer('orders.created', group='billing')` "
        "(docs/consuming.md)."
    )

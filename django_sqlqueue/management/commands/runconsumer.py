"""``manage.py runconsumer``: run registered consumers until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_sqlqueue.conf import get_settings
from django_sqlqueue.consumers import load_consumers, registry
from django_sqlqueue.shutdown import graceful_signals
from django_sqlqueue.worker import Worker

LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


class Command(BaseCommand):
    help = "Run the registered django-sqlqueue consumers (all, or those matching --group/--topic)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--group", action="append", default=[], help="consumer group to run (repeatable)")
        parser.add_argument("--topic", action="append", default=[], help="topic to consume (repeatable)")
        parser.add_argument("--name", default=None, help="subscriber name (default: host:pid)")

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(options["verbosity"])
        load_consumers()
        specs = registry.select(options["group"] or None, options["topic"] or None)
        if not specs:
            known = ", ".join(s.name for s in registry.all()) or "none"
            raise CommandError(
                f"no registered consumer matches --group {options['group'] or '*'} --topic {options['topic'] or '*'}"
                f" (registered group:topic pairs: {known})."
            )
        name = options["name"] or f"{socket.gethostname()}:{os.getpid()}"
        worker = Worker(specs, name=name, conf=get_settings())
        with graceful_signals(worker.stop):
            worker.run()


def configure_logging(verbosity: int) -> None:
    """Send django_sqlqueue's log records to stderr at the level --verbosity asks for."""
    logger = logging.getLogger("django_sqlqueue")
    logger.setLevel(LEVELS.get(verbosity, logging.DEBUG))
    if not logger.handlers:  # the project's LOGGING may already route it
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        handler._sqlqueue = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False

"""Where a worker's log records go: the project's ``LOGGING`` first.

``runconsumer`` calls :func:`configure_worker_logging`:

- without ``-v``/``--verbosity`` on the command line it leaves the project's ``LOGGING``
  alone. Only if no handler would receive the ``django_sqlqueue`` records at all
  (neither that logger, its parents nor the root have one -- Django's default ``LOGGING``
  configures only the ``django`` logger) does it add a stderr handler at INFO, so the
  lifecycle lines (start, leases, outages, stop) are not lost;
- with an explicit ``-v N`` it sets the ``django_sqlqueue`` level (0 WARNING, 1 INFO,
  2 and 3 DEBUG) and adds a stderr handler unless one of the handlers the records reach
  already writes to the console (then that handler shows them, in the project's
  format). Records still propagate to the project's other handlers (files, Sentry...).
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "django_sqlqueue"
LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def configure_worker_logging(verbosity: int | None) -> None:
    """Configure ``django_sqlqueue`` logging for a worker; ``verbosity`` None = not given."""
    logger = logging.getLogger(LOGGER_NAME)
    if verbosity is None:
        if not logger.hasHandlers():
            if logger.level == logging.NOTSET:
                logger.setLevel(logging.INFO)
            _add_stderr_handler(logger)
        return
    logger.setLevel(LEVELS.get(verbosity, logging.DEBUG))
    if not _reaches_console(logger):
        _add_stderr_handler(logger)


def _add_stderr_handler(logger: logging.Logger) -> None:
    if any(getattr(h, "_sqlqueue", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler._sqlqueue = True  # type: ignore[attr-defined]
    logger.addHandler(handler)


def _reaches_console(logger: logging.Logger) -> bool:
    """True if a handler the logger's records reach writes to stderr or stdout."""
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (
                sys.stderr,
                sys.stdout,
                sys.__stderr__,
                sys.__stdout__,
            ):
                return True
        current = current.parent if current.propagate else None
    return False

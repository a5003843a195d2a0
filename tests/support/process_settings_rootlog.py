"""Process settings whose LOGGING has only a root handler (a file), as many projects do.

The file is ``$SQLQUEUE_TEST_LOGFILE``; nothing names the ``django_sqlqueue`` logger.
"""

import os

from tests.support.process_settings import *  # noqa: F403

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"root": {"format": "ROOT %(levelname)s %(name)s %(message)s"}},
    "handlers": {
        "file": {"class": "logging.FileHandler", "filename": os.environ["SQLQUEUE_TEST_LOGFILE"], "formatter": "root"}
    },
    "root": {"handlers": ["file"], "level": "INFO"},
}

"""Settings of bench/limits.py's ``runconsumer`` processes (and of the bench itself): the task
tests' process settings, with every topic's partition count from ``BENCH_PARTITIONS``
(``--partitions``; unset: the project's). See the bench's docstring for why it matters."""

import os

from tests.support.taskapp.process_settings import *  # noqa: F403
from tests.support.taskapp.process_settings import SQLQUEUE

if os.environ.get("BENCH_PARTITIONS"):
    SQLQUEUE = {**SQLQUEUE, "PARTITIONS": int(os.environ["BENCH_PARTITIONS"])}

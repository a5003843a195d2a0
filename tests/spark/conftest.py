"""Fixtures of the Spark tests: one real SparkSession per test run, on a real database.

The whole directory is skipped (with the reason) when pyspark is not installed, so the
default suite runs without the ``spark`` extra; CI installs it and runs these too.
Executors are separate Python processes: they must import this repository
(``PYTHONPATH``) with the test run's interpreter (``PYSPARK_PYTHON``), and they reach
the test database through the options built by ``sqlqueue_options()``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    import pyspark  # noqa: F401
except ImportError:
    HAVE_PYSPARK = False
else:
    HAVE_PYSPARK = True
SKIP_REASON = "pyspark is not installed (the spark extra: pip install 'django-sqlqueue[spark]')"

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Skip this directory's tests, with the reason, when pyspark is missing."""
    if HAVE_PYSPARK:
        return
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def spark_environment() -> None:
    """Make Spark's Python workers use this interpreter and see this repository."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One SparkSession for the whole run (starting one takes 7-12 s).

    ``local[2,2]``: two cores, and a failed task is retried once (plain ``local[2]``
    ignores ``spark.task.maxFailures`` and fails the job at the first task failure).
    """
    from django_sqlqueue.spark.session import build_session

    spark_environment()
    session = build_session(
        "local[2,2]",
        "sqlqueue-tests",
        {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    # Spark discovers the top-level ``pyspark_sqlqueue`` module (no register()); the lookup
    # is lazy and does not work from a thread other than the session's first one, so it
    # happens here, on the main thread.
    assert session.read.format("sqlqueue").load().columns[:3] == ["topic", "partition", "offset"]
    yield session
    session.stop()


@pytest.fixture
def queue_options(django_db_setup: Any) -> dict[str, str]:
    """The data source options of the test database."""
    from django_sqlqueue.spark import sqlqueue_options

    return sqlqueue_options()

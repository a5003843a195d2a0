"""spark/runtime.py: Django inside Spark's Python workers -- one alias per connection, closed after use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from django_sqlqueue.publisher import publish
from django_sqlqueue.spark.options import Connection
from django_sqlqueue.spark.runtime import alias_for, driver_database

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


def test_the_alias_is_named_after_the_connection(queue_options) -> None:
    conn = Connection.from_options(queue_options)
    assert alias_for(conn) == alias_for(Connection.from_options(dict(queue_options)))
    assert alias_for(conn).startswith("sqlqueue_spark_")
    other = {**queue_options, "database": queue_options.get("database", "") + "_other"}
    assert alias_for(Connection.from_options(other)) != alias_for(conn)


def test_a_worker_without_django_gets_a_minimal_project_and_the_connection_is_closed_after(queue_options) -> None:
    """As in a Spark Python worker: a fresh process, no settings; Django is set up on first use."""
    publish("runtime.t", {"n": 1})
    code = (
        "import json, sys\n"
        "from django_sqlqueue.spark.runtime import alias_for, database\n"
        "from django_sqlqueue.spark.options import Connection\n"
        "options = json.loads(sys.argv[1])\n"
        "with database(options) as alias:\n"
        "    from django.db import connections\n"
        "    from django_sqlqueue.models import Message\n"
        "    print(alias == alias_for(Connection.from_options(options)))\n"
        "    print(Message.objects.using(alias).filter(topic='runtime.t').count())\n"
        "print(connections[alias].connection is None)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run(
        [sys.executable, "-c", code, json.dumps(queue_options)], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "1", "True"]


def test_the_driver_reuses_the_projects_own_alias(queue_options) -> None:
    with driver_database(queue_options) as alias:
        assert alias == "default"

"""testing/pytest_plugin.py: the fixtures ``sqlqueue_published`` and ``sqlqueue_drain``, offered
to every test, used only by those that name them, and loading nothing of Django until then; a
drain in a test without the database fails with one error that says what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from django_sqlqueue import publish
from django_sqlqueue.consumers import ConsumerSpec, registry
from django_sqlqueue.testing import pytest_plugin

from .inner_pytest import run_inner_pytest

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "testing.plugin"


def test_the_plugin_is_registered_under_its_module_name(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.get_plugin("django_sqlqueue.testing.pytest_plugin") is pytest_plugin
    assert not [name for name in vars(pytest_plugin) if name.startswith("pytest_")]  # fixtures only, no hook


@pytest.mark.django_db
def test_the_fixtures_capture_and_drain_the_test(sqlqueue_published: Any, sqlqueue_drain: Any) -> None:
    seen: list[Any] = []
    spec = ConsumerSpec(topic=TOPIC, group="g", handler=lambda message: seen.append(message.payload))
    registry.register(spec)
    try:
        publish(TOPIC, {"n": 1}, key="k")
        sqlqueue_published.assert_published(TOPIC, key="k", payload={"n": 1}, count=1)
        summary = sqlqueue_drain(TOPIC)
    finally:
        registry.unregister(spec.group, spec.topic)
    assert (summary.handled, seen) == (1, [{"n": 1}])


def test_a_test_that_names_no_fixture_gets_none_and_django_stays_unloaded(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(
        "import sys\n"
        "def test_inner(request):\n"
        "    assert not {'sqlqueue_published', 'sqlqueue_drain'} & set(request.fixturenames)\n"
        "    assert not [m for m in sys.modules if m == 'django' or m.startswith('django.')]\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    args = [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider", "-q"]
    plugin = ["-p", "django_sqlqueue.testing.pytest_plugin"]
    run = subprocess.run([*args, *plugin, "test_inner.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    listing = subprocess.run([*args, *plugin, "--fixtures"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "sqlqueue_published" in listing.stdout and "sqlqueue_drain" in listing.stdout
    # Removed by name, whether the entry point (an installed package) or -p loads it.
    removed = ["-p", "no:django_sqlqueue.testing.pytest_plugin"]
    without = subprocess.run([*args, *removed, "--fixtures"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "sqlqueue_published" not in without.stdout


def test_a_drain_in_a_test_without_the_database_fails_with_one_error(tmp_path: Path) -> None:
    # Issue 29: pytest-django's refusal was buried under a failing lease release per consumer.
    run = run_inner_pytest(
        tmp_path,
        "from django_sqlqueue.testing import drain\n\n"
        "def test_fixture_without_the_database(sqlqueue_drain):\n"
        "    sqlqueue_drain()\n\n"
        "def test_drain_without_the_database():\n"
        "    drain()\n",
    )
    assert run.outcomes == {
        "test_fixture_without_the_database": (
            "django_sqlqueue.exceptions.TestingError: sqlqueue_drain needs the database: mark the test "
            "@pytest.mark.django_db (the test's transaction is enough) or use the transactional_db fixture."
        ),
        "test_drain_without_the_database": (
            'RuntimeError: Database access not allowed, use the "django_db" mark, or the "db" or '
            '"transactional_db" fixtures to enable it.'
        ),
    }, run.output[-3000:]
    assert "could not release leases" not in run.output and "Captured" not in run.output, run.output[-3000:]
    assert len(run.output.splitlines()) < 120, run.output

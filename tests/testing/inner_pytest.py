"""Run a small test module in a pytest subprocess, as a project's suite would run it.

For the tests of what one test leaves to the next (a capture) and of what a user sees when a
test is set up wrong (``sqlqueue_drain`` without the database): both need a pytest session of
their own. With ``database`` the inner session uses that database as it is -- the test
database this session created and migrated (``django_db_setup``), named by the caller --
through pytest-django's documented override of ``django_db_setup``, so it starts in about a
second and never creates, migrates or drops a database. Its tests roll back (``django_db``,
``TestCase``), so they leave nothing behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SETTINGS = """
import os
from tests.support.settings import *  # noqa: F403
from tests.support.settings import DATABASES

DATABASES = {alias: {**db, "NAME": os.environ["SQLQUEUE_INNER_DATABASE"]} for alias, db in DATABASES.items()}
"""

_CONFTEST = '''
import pytest

@pytest.fixture(scope="session")
def django_db_setup():
    """The database of the session that started this one, created and migrated already."""
'''


@dataclass
class InnerRun:
    """What the inner session printed, and each test's outcome by name."""

    returncode: int
    output: str
    #: test name -> "passed", or the failure's message ("<exception class>: <text>").
    outcomes: dict[str, str]


def run_inner_pytest(tmp_path: Path, source: str, *, database: str | None = None) -> InnerRun:
    """Run ``source`` as ``test_inner.py`` in a pytest subprocess; ``database``: the NAME of an
    existing, migrated database for its ``django_db`` tests (none: they cannot use one)."""
    (tmp_path / "test_inner.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    settings = "tests.support.settings"
    if database is not None:
        (tmp_path / "inner_settings.py").write_text(_SETTINGS)
        (tmp_path / "conftest.py").write_text(_CONFTEST)
        env["SQLQUEUE_INNER_DATABASE"] = database
        settings = "inner_settings"
    env.pop("DJANGO_SETTINGS_MODULE", None)
    report = tmp_path / "report.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "django_sqlqueue.testing.pytest_plugin",
            "--ds",
            settings,
            f"--junitxml={report}",
            "test_inner.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        outcomes[case.get("name", "")] = "passed" if failure is None else failure.get("message", "")
    return InnerRun(done.returncode, done.stdout + done.stderr, outcomes)

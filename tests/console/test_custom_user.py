"""The console under a custom user model whose primary key is a string (issue 27).

The audit log (``console/base.py``'s ``audit``) once wrote ``user_id=int(request.user.pk)``:
with a key such as a username every console action failed at its audit step, after its
writes had committed. ``AUTH_USER_MODEL`` cannot change inside one test process, so this test
runs ``custom_user_scenario.py`` in a pytest subprocess with
``tests.support.settings_custom_user`` (the same database server, a test database of its own).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..support.processes import ROOT

# Creating and migrating a test database of its own takes the subprocess several seconds.
pytestmark = pytest.mark.slow


def test_a_console_action_is_audited_under_a_user_model_keyed_by_a_string():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--ds",
            "tests.support.settings_custom_user",
            "tests/console/custom_user_scenario.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout

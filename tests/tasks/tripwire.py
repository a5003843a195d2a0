"""Not a task module, and not part of an installed app: importing it leaves a mark.

tests/tasks/test_trust.py names it in forged task messages and checks that neither the
worker nor ``get_result()`` imports it (its top-level code must never run).
"""

from __future__ import annotations

import os

#: Set by importing this module.
MARK = "SQLQUEUE_TEST_TRIPWIRE"

os.environ[MARK] = "imported"


def anything() -> None:
    """What a forged message names."""

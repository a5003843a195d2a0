"""tasks/compat.py: which django.tasks the backend uses (Django 6's own, or the backport on 5.2).

Real database, real Worker threads (the same code runconsumer runs); the process-level
claims (kill -9, several workers) are in tests/processes/test_tasks.py. The backend is
configured by tests/tasks/conftest.py.
"""

from __future__ import annotations

import pytest

from django_sqlqueue.tasks.compat import BUILTIN

pytestmark = pytest.mark.django_db(transaction=True)


def test_which_django_tasks() -> None:
    import django

    assert (django.VERSION >= (6, 0)) == BUILTIN

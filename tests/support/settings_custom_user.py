"""Test settings with a custom user model keyed by a string (``tests/support/customuserapp``).

For ``tests/console/custom_user_scenario.py`` only, which ``tests/console/test_custom_user.py``
runs in a pytest subprocess (``AUTH_USER_MODEL`` cannot change inside one test process). The
same database server as the suite's, but a test database of its own (``..._customuser``), so
the subprocess never touches the test database of the process that started it.
"""

from pathlib import Path

from .settings import *  # noqa: F403
from .settings import DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.customuserapp"]
AUTH_USER_MODEL = "customuserapp.Operator"


def _own_test_database(db: dict) -> dict:
    test = dict(db.get("TEST") or {})
    if db["ENGINE"].endswith("sqlite3"):
        name = Path(test.get("NAME") or db["NAME"])
        test["NAME"] = str(name.with_name(f"{name.stem}_customuser{name.suffix}"))
    else:
        test["NAME"] = f"{test.get('NAME') or 'test_' + db['NAME']}_customuser"
    return {**db, "TEST": test}


DATABASES = {
    **DATABASES,
    "default": _own_test_database(DATABASES["default"]),
    "other": {**DATABASES["other"], "TEST": {**DATABASES["other"]["TEST"], "MIRROR": "default"}},
}

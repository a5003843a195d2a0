"""Test settings: the test project, on MariaDB/MySQL unless DATABASE_URL says otherwise.

The suite proves locking and ordering claims, which need a real server: it defaults to
the local MariaDB that ``.ci/test`` starts.
"""

import os

os.environ.setdefault("DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue")

from testproject.settings import *  # noqa: E402,F401,F403

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

INSTALLED_APPS = [*INSTALLED_APPS, "tests.consumerapp"]  # noqa: F405

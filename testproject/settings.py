"""Settings of the example project that uses django-sqlqueue.

``DATABASE_URL`` chooses the database (django-environ syntax):

- unset: an embedded SQLite file (``testproject/db.sqlite3``), so the demo runs anywhere;
- ``mysql://root@127.0.0.1:3306/sqlqueue``: MariaDB/MySQL, the primary backend;
- ``postgres://postgres@127.0.0.1:5432/sqlqueue``: PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path

import environ

from django_sqlqueue.conf import DURATION_KEYS

BASE_DIR = Path(__file__).resolve().parent
env = environ.Env()

SECRET_KEY = env.str("SECRET_KEY", default="django-sqlqueue-testproject-not-secret")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_sqlqueue",
    "testproject.orders",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # X-Frame-Options: DENY on every page: no other site can frame the console's one-click
    # buttons (clickjacking). Projects using the console should keep it.
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]


def database_config(url: str) -> dict:
    """Return a DATABASES entry for ``url`` with the options the queue needs."""
    db = environ.Env.db_url_config(url)
    options = db.setdefault("OPTIONS", {})
    engine = db["ENGINE"]
    if engine.endswith("mysql"):
        # READ COMMITTED: REPEATABLE READ's gap locks make concurrent queue consumers deadlock.
        options.setdefault("isolation_level", "read committed")
        options.setdefault("charset", "utf8mb4")
        db.setdefault("TEST", {}).setdefault("CHARSET", "utf8mb4")
    elif engine.endswith("sqlite3"):
        # One writer at a time: take the write lock at BEGIN (no "database is locked" on
        # upgrade), WAL so readers never block the writer, and wait rather than fail.
        options.setdefault("transaction_mode", "IMMEDIATE")
        options.setdefault("timeout", 20)
        options.setdefault("init_command", "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
    return db


DATABASES = {"default": database_config(env.str("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Every key may be overridden from the environment (SQLQUEUE_<KEY>), e.g. by the demo.
SQLQUEUE = {key: env.float(f"SQLQUEUE_{key}") for key in DURATION_KEYS if f"SQLQUEUE_{key}" in env}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"django_sqlqueue": {"handlers": ["stderr"], "level": env.str("SQLQUEUE_LOG_LEVEL", default="INFO")}},
}

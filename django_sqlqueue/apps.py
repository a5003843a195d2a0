from __future__ import annotations

from django.apps import AppConfig


class SQLQueueConfig(AppConfig):
    name = "django_sqlqueue"
    verbose_name = "SQL queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401  (registers the system checks)
            conf,  # noqa: F401  (connects setting_changed)
        )

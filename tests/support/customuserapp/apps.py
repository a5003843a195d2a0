"""The app config of the custom-user test app."""

from __future__ import annotations

from django.apps import AppConfig


class CustomUserAppConfig(AppConfig):
    name = "tests.support.customuserapp"
    label = "customuserapp"
    default_auto_field = "django.db.models.BigAutoField"

from django.apps import AppConfig


class ExactlyOnceAppConfig(AppConfig):
    name = "tests.chaos.eoapp"
    label = "eoapp"
    default_auto_field = "django.db.models.BigAutoField"

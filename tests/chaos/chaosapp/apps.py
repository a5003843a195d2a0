from django.apps import AppConfig


class ChaosAppConfig(AppConfig):
    name = "tests.chaos.chaosapp"
    label = "chaosapp"
    default_auto_field = "django.db.models.BigAutoField"

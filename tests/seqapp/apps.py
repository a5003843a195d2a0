from django.apps import AppConfig


class SeqAppConfig(AppConfig):
    name = "tests.seqapp"
    label = "seqapp"
    default_auto_field = "django.db.models.BigAutoField"

from django.apps import AppConfig


class SeqAppConfig(AppConfig):
    name = "tests.support.seqapp"
    label = "seqapp"
    default_auto_field = "django.db.models.BigAutoField"

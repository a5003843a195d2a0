from django.apps import AppConfig


class ConsumerAppConfig(AppConfig):
    name = "tests.consumerapp"
    label = "consumerapp"
    default_auto_field = "django.db.models.BigAutoField"

from django.apps import AppConfig


class ConsumerAppConfig(AppConfig):
    name = "tests.support.consumerapp"
    label = "consumerapp"
    default_auto_field = "django.db.models.BigAutoField"

from django.apps import AppConfig


class OtelAppConfig(AppConfig):
    name = "tests.support.otelapp"
    label = "otelapp"

from django.apps import AppConfig


class OtelAppConfig(AppConfig):
    name = "tests.otelapp"
    label = "otelapp"

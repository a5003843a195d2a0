from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "bench.benchapp"
    label = "benchapp"
    verbose_name = "django-sqlqueue benchmark consumers"

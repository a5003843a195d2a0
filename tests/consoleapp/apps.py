from django.apps import AppConfig


class ConsoleAppConfig(AppConfig):
    name = "tests.consoleapp"
    label = "consoleapp"

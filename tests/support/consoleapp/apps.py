from django.apps import AppConfig


class ConsoleAppConfig(AppConfig):
    name = "tests.support.consoleapp"
    label = "consoleapp"

from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "testproject.orders"
    label = "orders"
    default_auto_field = "django.db.models.BigAutoField"

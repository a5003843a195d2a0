from django.urls import path

from . import views

urlpatterns = [
    path("", views.create_order, name="create-order"),
    path("failing/", views.create_order_then_fail, name="create-order-failing"),
]

from django.contrib import admin
from django.urls import include, path

from django_sqlqueue.metrics.views import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", include("testproject.orders.urls")),
    path("sqlqueue/metrics", metrics),
]

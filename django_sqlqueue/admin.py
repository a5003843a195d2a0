"""The queue's entry in the Django admin: the operator console.

The admin cannot register models with a composite primary key (every queue table but
the log has one), so the console is a set of custom views hung off the ModelAdmin of
an unmanaged placeholder model, :class:`~django_sqlqueue.models.QueueConsole`. No
AdminSite has to be swapped: the app registers itself with ``admin.site``. See
``docs/console.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import path

from .console.actionlog import ActionLogPage
from .console.actions import Views
from .console.base import VIEW, has, refuse_nul, refuse_oversized, with_database
from .models import QueueConsole


@admin.register(QueueConsole)
class QueueConsoleAdmin(admin.ModelAdmin):
    """Routes the console's pages; the index link ("Queue console") opens the overview."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return has(request, VIEW)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has(request, VIEW)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        return self._views.overview(request)

    @property
    def _views(self) -> Views:
        return Views(self.admin_site)

    def get_urls(self) -> list[Any]:
        views = self._views
        wrap = self.admin_site.admin_view
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        routes: list[tuple[str, Callable[..., HttpResponse], str]] = [
            ("", views.overview, "changelist"),
            ("overview/", views.overview, "overview"),
            ("messages/", views.messages, "messages"),
            ("messages/<int:seq>/", views.message, "message"),
            ("groups/", views.groups, "groups"),
            ("groups/drop/", views.drop, "drop"),
            ("groups/<str:group>/<str:topic>/", views.group, "group"),
            ("groups/<str:group>/<str:topic>/seek/", views.seek, "seek"),
            ("groups/<str:group>/<str:topic>/pause/", views.pause, "pause"),
            ("leases/", views.leases, "leases"),
            ("leases/release/", views.release, "release"),
            ("deliveries/", views.deliveries, "deliveries"),
            ("deadletters/", views.deadletters, "deadletters"),
            ("deadletters/action/", views.deadletter_action, "deadletter_action"),
            ("deadletters/<int:seq>/", views.deadletter, "deadletter"),
            ("topics/", views.topics, "topics"),
            ("topics/purge/", views.purge_topic, "purge_topic"),
            ("tasks/", views.tasks, "tasks"),
            ("tasks/action/", views.task_action, "task_action"),
            ("tasks/waiting/", views.waiting, "task_waiting"),
            ("tasks/batches/", views.batches, "task_batches"),
            ("tasks/schedules/", views.schedules, "task_schedules"),
            ("tasks/result/<path:result_id>/", views.task, "task"),
            ("actionlog/", ActionLogPage(self.admin_site).actionlog, "actionlog"),
        ]
        return [
            path(
                route,
                # The Tasks tab is of SQLQUEUE["DATABASE"] (the tasks backend's results live there).
                wrap(refuse_nul(refuse_oversized(with_database(view, fixed=suffix.startswith("task"))))),
                name=f"{name}_{suffix}",
            )
            for route, view, suffix in routes
        ]

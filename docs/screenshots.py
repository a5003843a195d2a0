"""Take the console screenshots shown in the README (a pytest module, run on purpose):

    DATABASE_URL=mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_shots \
        .venv/bin/python -m pytest -q -p no:cacheprovider docs/screenshots.py

Headless Debian Chromium through Playwright; writes docs/console-*.png.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue.models import PartitionLease
from django_sqlqueue.task_models import TaskResultRecord
from tests.support.console_scene import SETTINGS, build

DOCS = Path(__file__).resolve().parent
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.mark.django_db(transaction=True)
def test_screenshots(live_server, monkeypatch):
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with override_settings(SQLQUEUE=SETTINGS):
        build()
        PartitionLease.objects.filter(partition=1).update(lease_renewed_at=timezone.now() - dt.timedelta(minutes=3))
        User.objects.create_superuser("ops", "ops@example.com", "pw")
        task_results()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            for scheme, width, suffix in (("light", 1280, ""), ("dark", 390, "-dark-narrow")):
                page = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme).new_page()
                page.goto(f"{live_server.url}/admin/login/")
                page.fill("#id_username", "ops")
                page.fill("#id_password", "pw")
                page.click("input[type=submit]")
                base = f"{live_server.url}/admin/django_sqlqueue/queueconsole"
                shots = {
                    "overview": "/",
                    "group": "/groups/billing/orders/",
                    "deadletters": "/deadletters/",
                    "tasks": "/tasks/",
                }
                for name, path in shots.items():
                    if suffix and name != "overview":
                        continue
                    page.goto(base + path)
                    page.wait_for_selector(".sq-tabs")
                    page.screenshot(path=str(DOCS / f"console-{name}{suffix}.png"), full_page=True)
            browser.close()


def task_results() -> None:
    """A few results of the tasks backend for the Tasks tab."""
    now = timezone.now()
    rows = [
        ("SUCCESSFUL", "shop.tasks.send_receipt", [1041], []),
        ("FAILED", "shop.tasks.charge_card", [1042], ["builtins.ValueError"] * 3),
        ("RUNNING", "shop.tasks.rebuild_search_index", [], []),
        ("FAILED", "shop.tasks.send_receipt", [1043], ["django_sqlqueue.exceptions.TaskCancelled"]),
        ("READY", "shop.tasks.charge_card", [1044], ["builtins.TimeoutError"]),
    ]
    for n, (status, path, args, errors) in enumerate(rows):
        at = now - dt.timedelta(minutes=10 - n)
        TaskResultRecord.objects.create(
            id=f"4f1c2a7e-0000-4000-8000-00000000000{n}",
            backend="default",
            queue_name="default",
            topic="tasks.default",
            task_path=path,
            status=status,
            args=args,
            kwargs={"currency": "EUR"} if args else {},
            enqueued_at=at,
            started_at=at,
            finished_at=at + dt.timedelta(seconds=2) if status in ("SUCCESSFUL", "FAILED") else None,
            errors=[{"exception_class_path": e, "traceback": f"Traceback ...\n{e}: declined"} for e in errors],
            worker_ids=["web-1:4242"] * max(1, len(errors)),
        )

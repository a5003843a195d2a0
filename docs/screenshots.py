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

from django_sqlqueue.models import Message, Partition, PartitionLease
from django_sqlqueue.task_models import TaskResultRecord
from tests.support.console_scene import SETTINGS, build
from tests.support.taskapp.settings_common import TASKS

DOCS = Path(__file__).resolve().parent
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.mark.django_db(transaction=True)
def test_screenshots(live_server, monkeypatch):
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with override_settings(SQLQUEUE=SETTINGS, TASKS=TASKS):
        build()
        PartitionLease.objects.filter(partition=1).update(lease_renewed_at=timezone.now() - dt.timedelta(minutes=3))
        User.objects.create_superuser("ops", "ops@example.com", "pw")
        task_results()
        waiting_tasks()
        history()
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
                    "group-24h": "/groups/billing/orders/?window=24h",
                    "deadletters": "/deadletters/",
                    "tasks": "/tasks/",
                    "tasks-waiting": "/tasks/waiting/",
                }
                for name, path in shots.items():
                    if suffix and name not in ("overview", "group"):
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


def waiting_tasks() -> None:
    """A few task messages no worker started, for the Tasks tab's Waiting page (one not
    sequenced yet, one with a ``run_after`` an hour away)."""
    now = timezone.now()
    Partition.objects.create(topic="tasks.default", partition=0, head_offset=2, created_at=now)
    waiting = [
        ("shop.tasks.send_receipt", [1045], 1, now),
        ("shop.tasks.charge_card", [1046], 2, now),
        ("shop.tasks.send_receipt", [1047], None, now + dt.timedelta(hours=1)),
    ]
    for n, (path, args, offset, deliver_at) in enumerate(waiting):
        Message.objects.create(
            topic="tasks.default",
            partition=0,
            offset=offset,
            id=f"9b3e5d10-0000-4000-8000-00000000000{n}",
            payload={"task": path, "args": args, "kwargs": {"currency": "EUR"}, "queue_name": "default"},
            metadata={"task": path},
            deliver_at=deliver_at,
            created_at=now - dt.timedelta(minutes=3 - n),
            published_at=now - dt.timedelta(minutes=3 - n),
        )


def history() -> None:
    """A day of billing's and shipping's history on orders, simulated minute by minute: 120
    messages a minute and a capacity of 180; failures 15 hours ago; a burst 10 hours ago that
    billing works off; an hour without workers (nothing sequenced, nothing handled: a gap, then
    the backlog at once); and a burst 45 minutes ago that billing is still catching up on."""
    from django_sqlqueue.db.store import QueueStore
    from django_sqlqueue.models import HistoryMinute

    now = QueueStore("default").now_minute()
    rows, arrived, published, handled, failed, dead = [], 0, 0, 0, 0, 0
    for k in range(24 * 60, -1, -1):  # minutes ago, oldest first
        arrived += 120 + (400 if 600 <= k < 640 else 0) + (200 if 25 <= k < 45 else 0)
        if 300 <= k < 360:
            continue  # no worker ran: nothing sequenced, handled or sampled (a gap)
        published = arrived  # the workers' sequencer numbers what arrived
        handled += min(published - handled, 180)
        failed += 3 if 900 <= k < 930 else 0
        dead += 1 if 900 <= k < 910 else 0
        for group, g_handled, g_failed, g_dead in (
            ("billing", handled, failed, dead),
            ("shipping", published, 0, 0),
        ):
            rows.append(
                HistoryMinute(
                    consumer_group=group,
                    topic="orders",
                    minute=now - k,
                    published=published,
                    handled=g_handled,
                    failed=g_failed,
                    dead_lettered=g_dead,
                    lag=published - g_handled,
                )
            )
    HistoryMinute.objects.bulk_create(rows, batch_size=2000)

"""The console's Tasks tab (console/tasks.py) in a real headless Chromium: the list and its
filters, a task's page (its traceback escaped), retrying a failed task end to end (a real
Worker thread runs it again and it succeeds), cancelling a waiting task, batches, schedules;
each action refused without its permission, confirmed first, and audited in ``LogEntry``."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterator

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue.console.tasks import CANCEL_OUTCOMES
from django_sqlqueue.ops.tasks import dead_letter_of
from django_sqlqueue.task_models import ScheduleState, TaskBatch, TaskResultRecord
from tests.support.task_helpers import finished, running_worker, task_settings, wait_until

from .test_browser import ARGS, CHROMIUM

#: A traceback that would inject markup if the page did not escape it.
EVIL = "<b id='injected'>bold</b><script>window.pwned = 1</script>"

slow = pytest.mark.slow
needs_chromium = pytest.mark.skipif(
    not shutil.which(CHROMIUM), reason=f"{CHROMIUM} is not installed (.ci/run installs it)"
)


def u(name: str, *args: str) -> str:
    return reverse(f"admin:django_sqlqueue_queueconsole_{name}", args=args)


@pytest.fixture
def tasks_on() -> Iterator[None]:
    from django_sqlqueue.tasks.marks import marks

    with task_settings():
        yield
    assert marks.close_connections()


@pytest.fixture
def page(monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        yield context.new_page()
        browser.close()
        connections.close_all()


def user(name: str, *perms: str) -> User:
    someone = User.objects.create_user(name, password="secret-pw", is_staff=True)
    someone.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_sqlqueue", codename__in=perms)
    )
    return someone


def browser_login(page, live_server, name: str) -> None:
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", name)
    page.fill("#id_password", "secret-pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#content")


def failed_record(rid: str, traceback: str = EVIL, **kw) -> TaskResultRecord:
    now = timezone.now()
    fields = {
        "backend": "default",
        "queue_name": "default",
        "topic": "tasks.default",
        "task_path": "tests.support.taskapp.tasks.always_fails",
        "status": "FAILED",
        "args": ["<i>arg</i>"],
        "enqueued_at": now - dt.timedelta(seconds=5),
        "started_at": now - dt.timedelta(seconds=4),
        "finished_at": now,
        "errors": [{"exception_class_path": "builtins.RuntimeError", "traceback": traceback}],
        "worker_ids": ["web-1:4242"],
        **kw,
    }
    return TaskResultRecord.objects.create(id=rid, **fields)


# -- through the test client: permissions, confirmation, audit ------------------------------


@pytest.mark.django_db
def test_actions_need_their_permission_post_and_confirmation():
    failed_record("r1")
    viewer = Client()
    viewer.force_login(user("viewer", "view_queue"))
    assert viewer.get(u("tasks")).status_code == 200
    assert viewer.get(u("task", "r1")).status_code == 200
    for action in ("retry", "cancel"):
        assert viewer.post(u("task_action"), {"action": action, "id": "r1", "confirmed": "yes"}).status_code == 403
    nobody = Client()
    nobody.force_login(user("nobody"))
    assert nobody.get(u("tasks")).status_code == 403
    operator = Client()
    operator.force_login(user("op", "view_queue", "cancel_task", "replay_deadletter"))
    assert operator.get(u("task_action")).status_code == 403  # actions are POST only
    # Without "confirmed": the confirmation page, and nothing is changed.
    response = operator.post(u("task_action"), {"action": "cancel", "id": "r1"})
    assert response.status_code == 200 and b'id="confirm-button"' in response.content
    assert TaskResultRecord.objects.get(id="r1").cancel_requested_at is None
    assert not LogEntry.objects.exists()
    # A failed task without a dead letter (purged, say) cannot be retried: said, nothing written.
    response = operator.post(u("task_action"), {"action": "retry", "id": "r1", "confirmed": "yes"}, follow=True)
    assert "has no dead letter to replay" in response.content.decode()
    assert not LogEntry.objects.exists()
    assert operator.get(u("task", "nope")).status_code == 404
    response = operator.post(u("task_action"), {"action": "explode", "id": "r1"}, follow=True)
    assert "nknown action" in response.content.decode()


@pytest.mark.django_db
def test_the_pages_escape_and_bound_what_tasks_hold():
    failed_record("r1", args=["x" * 50_000])
    viewer = Client()
    viewer.force_login(user("viewer", "view_queue"))
    listing = viewer.get(u("tasks"), {"status": "FAILED"}).content.decode()
    detail = viewer.get(u("task", "r1")).content.decode()
    for html in (listing, detail):
        assert EVIL not in html and "&lt;b id=&#x27;injected&#x27;&gt;" in html
    assert "x" * 201 not in listing and "x" * 50_000 in detail  # cut on the list, whole on its page
    assert "retry-button" not in detail and "cancel-button" not in detail  # no dead letter; finished
    bad = viewer.get(u("tasks"), {"status": "DONE"}).content.decode()
    assert "status must be one of" in bad
    assert viewer.get(u("tasks"), {"id": "r1"})["Location"] == u("task", "r1")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tasks_on")
def test_waiting_tasks_page_lists_bounds_and_refuses():
    from tests.support.taskapp import tasks

    waiting = tasks.add.enqueue("<i>" + "y" * 5000, 1)
    viewer = Client()
    viewer.force_login(user("viewer", "view_queue"))
    html = viewer.get(u("task_waiting")).content.decode()
    assert waiting.id in html and u("task", waiting.id) in html
    assert "&lt;i&gt;" in html and "<i>y" not in html and "y" * 201 not in html  # escaped, cut
    bad = viewer.get(u("task_waiting"), {"cursor": "tasks.default|x|1"}).content.decode()
    assert "cursor must be" in bad and waiting.id not in bad
    assert "order must be one of" in viewer.get(u("task_waiting"), {"order": "up"}).content.decode()
    nobody = Client()
    nobody.force_login(user("nobody"))
    assert nobody.get(u("task_waiting")).status_code == 403


def test_every_outcome_of_a_cancel_has_its_words():
    from django_sqlqueue.ops.task_cancel import CancelOutcome

    assert set(CANCEL_OUTCOMES) == {o.value for o in CancelOutcome}


# -- in Chromium ---------------------------------------------------------------------------


@slow
@needs_chromium
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tasks_on")
def test_list_filters_detail_and_retry_end_to_end(page, live_server):
    from django_sqlqueue.tasks.compat import TaskResultStatus
    from tests.support.taskapp import tasks

    user("ops", "view_queue", "replay_deadletter")
    failed_record("evil")
    ok = tasks.add.enqueue(1, 2)
    result = tasks.flaky.enqueue("console-retry", 3)  # fails MAX_ATTEMPTS (3) times, then would succeed
    with running_worker():
        assert finished(result).status == TaskResultStatus.FAILED and finished(ok).status == TaskResultStatus.SUCCESSFUL
        wait_until(lambda: dead_letter_of(result.id, "tasks.default"), 10, "the dead letter")
        browser_login(page, live_server, "ops")
        page.goto(f"{live_server.url}{u('overview')}")
        page.click(".sq-tabs >> text=Tasks")
        rows = page.inner_text("#tasks")
        assert "tests.support.taskapp.tasks.flaky" in rows and "tests.support.taskapp.tasks.add" in rows
        page.select_option("#task-status", "FAILED")
        page.fill("#task-name", "flaky")
        page.click("#task-filter")
        page.wait_for_selector("#tasks")
        assert page.locator("#tasks tbody tr").count() == 1 and "failed" in page.inner_text("#tasks")
        page.select_option("#task-status", "SUCCESSFUL")
        page.fill("#task-name", "")
        page.click("#task-filter")
        assert "tasks.add" in page.inner_text("#tasks") and "flaky" not in page.inner_text("#tasks")
        # The detail of a failed task whose traceback holds markup: shown as text.
        page.goto(f"{live_server.url}{u('task', 'evil')}")
        assert page.locator("#injected").count() == 0 and page.evaluate("window.pwned") is None
        assert EVIL in page.inner_text("#task-errors") and "web-1:4242" in page.inner_text("#task-attempts")
        assert page.locator("#retry-button").count() == 0  # no dead letter: nothing to retry
        # Retry the failed task: confirm, it runs again on the worker and succeeds.
        page.goto(f"{live_server.url}{u('task', result.id)}")
        assert "console-retry: planned failure" in page.inner_text("#task-errors")
        assert page.inner_text("#task-attempts").count("\n") == 3  # the head row and 3 attempts
        page.click("#retry-button")
        assert "Run task" in page.inner_text("#confirm-summary")
        assert TaskResultRecord.objects.get(id=result.id).status == "FAILED"  # not before confirming
        page.click("#confirm-button")
        assert "Retried task" in page.inner_text(".messagelist")
        done = finished(result)
    assert done.status == TaskResultStatus.SUCCESSFUL and len(done.errors) == 3
    entry = LogEntry.objects.get()
    assert entry.object_repr == f"task {result.id}" and "Retried task" in entry.change_message
    assert entry.user.username == "ops"
    page.reload()
    assert page.inner_text("#task-shown-status") == "successful" and page.locator("#retry-button").count() == 0


@slow
@needs_chromium
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tasks_on")
def test_cancel_a_waiting_task_and_refusal_without_permission(page, live_server):
    from tests.support.taskapp import tasks

    user("ops", "view_queue", "cancel_task")
    user("viewer", "view_queue")
    waiting = tasks.add.enqueue(5, 6)  # no worker runs: it waits
    browser_login(page, live_server, "viewer")
    page.goto(f"{live_server.url}{u('tasks')}")
    page.fill("#task-id", waiting.id)
    page.click("#task-open")
    assert page.inner_text("#task-shown-status") == "ready"
    assert page.locator("#cancel-button").count() == 0  # no permission: no button...
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    denied = page.request.post(
        f"{live_server.url}{u('task_action')}",
        form={"csrfmiddlewaretoken": token, "action": "cancel", "id": waiting.id, "confirmed": "yes"},
        headers={"Referer": live_server.url},
    )
    assert denied.status == 403  # ... and the POST is refused
    page.context.clear_cookies()
    browser_login(page, live_server, "ops")
    page.goto(f"{live_server.url}{u('tasks')}")
    page.click("#task-nav >> text=Waiting")  # the waiting tasks, read from the log
    assert waiting.id in page.inner_text("#waiting-tasks")
    page.click(f"#waiting-tasks >> text={waiting.id}")
    page.click("#cancel-button")
    assert "Cancel task" in page.inner_text("#confirm-summary")
    assert not LogEntry.objects.exists()
    page.click("#confirm-button")
    assert "Cancelled task" in page.inner_text(".messagelist")
    assert tasks.add.get_result(waiting.id).status.name == "FAILED"
    assert page.inner_text("#task-shown-status") == "cancelled" and page.locator("#cancel-button").count() == 0
    entry = LogEntry.objects.get()
    assert entry.object_repr == f"task {waiting.id}" and "CANCELLED" in entry.change_message
    page.goto(f"{live_server.url}{u('tasks')}?status=CANCELLED")
    assert page.locator("#tasks tbody tr").count() == 1
    page.goto(f"{live_server.url}{u('task_waiting')}")
    assert waiting.id not in page.inner_text("#waiting-tasks")  # cancelled: no longer waiting


@slow
@needs_chromium
@pytest.mark.django_db(transaction=True)
def test_batches_and_schedules_dark_and_narrow(page, live_server, settings):
    pytest.importorskip("croniter")
    now = timezone.now()
    settings.SQLQUEUE = {"SCHEDULES": {"nightly": {"cron": "0 3 * * *", "task": "shop.tasks.nightly"}}}
    ScheduleState.objects.create(name="nightly", last_tick=now - dt.timedelta(hours=2), created_at=now, updated_at=now)
    TaskBatch.objects.create(
        id="batch-1", backend="default", on_finish="shop.tasks.report", total=8, succeeded=5, failed=1, created_at=now
    )
    user("viewer", "view_queue")
    browser_login(page, live_server, "viewer")
    page.set_viewport_size({"width": 375, "height": 800})
    page.emulate_media(color_scheme="dark")
    page.goto(f"{live_server.url}{u('task_batches')}")
    row = page.inner_text("#batches")
    assert "batch-1" in row and "75%" in row and "shop.tasks.report" in row
    assert page.evaluate("document.documentElement.scrollWidth") <= 375 + 1
    page.click("#task-nav >> text=Recurring schedules")
    schedules = page.inner_text("#schedules")
    assert "nightly" in schedules and "0 3 * * *" in schedules and "03:00:00 UTC" in schedules
    assert (now - dt.timedelta(hours=2)).strftime("%Y-%m-%d %H:%M") in schedules
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != "rgb(255, 255, 255)"
    assert page.evaluate("document.documentElement.scrollWidth") <= 375 + 1

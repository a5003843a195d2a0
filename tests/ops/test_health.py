"""ops/health.py and ``manage.py queue_health``: every threshold's exit status (0 at it, 1 above) and lines.

The scene (tests/support/console_scene.py): on ``orders`` (2 partitions) ``billing`` is 4 behind
with a live subscriber and 3 dead letters, ``shipping`` caught up with 1 dead letter,
``retired`` 20 behind with no subscriber. Real database, real commands; the exit
statuses are also checked on real ``manage.py`` processes.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue import ops, publish
from django_sqlqueue.models import Message

from ..support.console_scene import SETTINGS, build
from ..support.processes import ROOT, database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("scene")]


@pytest.fixture
def scene():
    with override_settings(SQLQUEUE=SETTINGS):
        build()
        yield


def health(*args: str) -> tuple[int, list[str]]:
    """Run queue_health in this process: (exit status, stdout lines)."""
    from io import StringIO

    out = StringIO()
    try:
        call_command("queue_health", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue().splitlines()
    return 0, out.getvalue().splitlines()


def age_orders(seconds: float) -> None:
    """Make every message of ``orders`` published ``seconds`` ago."""
    Message.objects.filter(topic="orders").update(published_at=timezone.now() - dt.timedelta(seconds=seconds))


def test_no_threshold_given_is_healthy_whatever_the_state():
    status, lines = health()
    assert status == 0 and lines == ["ok: 3 group/topic pair(s) checked"]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--max-lag", "4"), None),
        (("--max-lag", "3"), "lag group=billing topic=orders value=4 max=3"),
        (("--max-dead-letters", "3"), None),
        (("--max-dead-letters", "2"), "dead_letters group=billing topic=orders value=3 max=2"),
        (("--max-dead-letters", "0"), "dead_letters group=billing topic=orders value=3 max=0"),
        (("--require-subscribers",), None),
    ],
)
def test_each_threshold_exits_0_at_it_and_1_above_it(args, line):
    status, lines = health("--group", "billing", *args)
    if line is None:
        assert (status, lines) == (0, ["ok: 1 group/topic pair(s) checked"])
    else:
        assert (status, lines) == (1, [line])


def test_require_subscribers_names_the_group_without_one():
    status, lines = health("--require-subscribers")
    assert (status, lines) == (1, ["subscribers group=retired topic=orders value=0 min=1"])


def test_max_lag_seconds_is_the_age_of_the_oldest_unhandled_message():
    age_orders(3600)
    assert health("--group", "billing", "--max-lag-seconds", "7200")[0] == 0
    status, lines = health("--group", "billing", "--max-lag-seconds", "60")
    assert status == 1 and len(lines) == 1
    m = re.fullmatch(r"lag_seconds group=billing topic=orders value=(\d+) max=60", lines[0])
    assert m and 3590 <= int(m.group(1)) < 3700
    # shipping is caught up: nothing of orders is unhandled for it, however old the log is.
    assert health("--group", "shipping", "--max-lag-seconds", "0")[0] == 0


def test_lag_seconds_counts_messages_waiting_for_the_sequencer():
    """A worker that stops sequencing (none running) must not hide the wait: unsequenced messages count."""
    publish("orders", {"late": 1}, key="k1")  # committed, no offset yet
    Message.objects.filter(topic="orders", offset__isnull=True).update(
        published_at=timezone.now() - dt.timedelta(seconds=600)
    )
    status, lines = health("--group", "shipping", "--max-lag-seconds", "300", "--max-lag", "1")
    assert status == 1
    assert len(lines) == 1
    assert re.fullmatch(r"lag_seconds group=shipping topic=orders value=(59\d|6[01]\d) max=300", lines[0])
    assert health("--group", "shipping", "--max-lag-seconds", "900")[0] == 0


def test_several_thresholds_give_one_line_each_in_a_stable_order():
    age_orders(120)
    status, lines = health(
        "--max-lag", "0", "--max-lag-seconds", "60", "--max-dead-letters", "1", "--require-subscribers"
    )
    assert status == 1
    assert [re.sub(r"value=\d+ max=60", "value=N max=60", line) for line in lines] == [
        "lag group=billing topic=orders value=4 max=0",
        "lag_seconds group=billing topic=orders value=N max=60",
        "dead_letters group=billing topic=orders value=3 max=1",
        "lag group=retired topic=orders value=20 max=0",
        "lag_seconds group=retired topic=orders value=N max=60",
        "subscribers group=retired topic=orders value=0 min=1",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--max-lag", "-1"), "max-lag must be an integer >= 0, got -1."),
        (("--max-dead-letters", "-5"), "max-dead-letters must be an integer >= 0, got -5."),
        (("--max-lag-seconds", "-0.5"), "max-lag-seconds must be a number of seconds >= 0, got -0.5."),
        (("--max-lag-seconds", "nan"), "max-lag-seconds must be a number of seconds >= 0, got nan."),
        (("--group", "nobody"), "no consumer group matches group 'nobody': nothing to check."),
        (("--group", "billing", "--topic", "typo"), "no consumer group matches group 'billing' topic 'typo'"),
    ],
)
def test_bad_input_is_an_error_with_status_2(args, message):
    with pytest.raises(CommandError) as caught:
        call_command("queue_health", *args)
    assert caught.value.returncode == 2 and message in str(caught.value)


def test_thresholds_refuse_what_the_command_line_cannot_give():
    with pytest.raises(ops.OperationError):
        ops.Thresholds(max_lag=1.5)  # type: ignore[arg-type]
    with pytest.raises(ops.OperationError):
        ops.Thresholds(max_lag_seconds=float("inf"))


def test_the_overview_shows_the_numbers_health_checks():
    """One definition: the console's rows are the rows queue_health checks."""
    age_orders(3600)
    rows = {g.group: g for g in ops.overview().groups}
    checked = {g.group: g for g in ops.check_health(ops.Thresholds()).groups}
    for group in ("billing", "shipping", "retired"):
        a, b = rows[group], checked[group]
        assert (a.lag, a.dead_letters, a.live_subscribers, a.oldest_unhandled_at) == (
            b.lag,
            b.dead_letters,
            b.live_subscribers,
            b.oldest_unhandled_at,
        )
    assert rows["billing"].lag_seconds >= 3590 and rows["shipping"].lag_seconds == 0
    assert rows["shipping"].oldest_unhandled_at is None


def test_lag_seconds_takes_a_bounded_number_of_statements():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for i in range(5):
        publish(f"extra{i}", {"n": i})  # more topics (unconsumed) do not add statements per group
    with CaptureQueriesContext(connection) as one_group:
        ops.check_health(ops.Thresholds(max_lag_seconds=1), group="billing")
    with CaptureQueriesContext(connection) as all_groups:
        ops.check_health(ops.Thresholds(max_lag_seconds=1))
    # Every read is grouped, the capped dead-letter counts too (one UNION ALL statement).
    assert len(all_groups.captured_queries) == len(one_group.captured_queries)


# -- real processes: the exit statuses a probe sees --------------------------------------


def run(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.process_settings",
        "DATABASE_URL": url or database_url(),
    }
    return subprocess.run(
        # The process settings route second.* to a second database: these probes read the first.
        [sys.executable, "manage.py", "queue_health", "--database", "default", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_exit_statuses_of_a_real_process():
    ok = run("--group", "billing", "--max-lag", "4")
    assert (ok.returncode, ok.stdout) == (0, "ok: 1 group/topic pair(s) checked\n")
    bad = run("--group", "billing", "--max-lag", "3", "--max-dead-letters", "2")
    assert bad.returncode == 1
    assert bad.stdout.splitlines() == [
        "lag group=billing topic=orders value=4 max=3",
        "dead_letters group=billing topic=orders value=3 max=2",
    ]
    unknown = run("--group", "nobody")
    assert unknown.returncode == 2 and "no consumer group matches group 'nobody'" in unknown.stderr
    usage = run("--max-lag", "many")
    assert usage.returncode == 2 and "invalid int value" in usage.stderr


@pytest.mark.slow
def test_an_unreachable_database_exits_2():
    from django.db import connection

    if connection.vendor == "sqlite":
        url = "sqlite:////nonexistent-dir/for/sqlqueue/health.sqlite3"
    else:
        scheme = {"mysql": "mysql", "postgresql": "postgres"}[connection.vendor]
        url = f"{scheme}://nobody:nothing@127.0.0.1:1/sqlqueue_h"  # nothing listens on port 1
    down = run("--max-lag", "10", url=url)
    assert down.returncode == 2 and "could not read the queue database" in down.stderr


def test_thresholds_of_the_setting_apply_and_a_flag_overrides_its_own():
    """SQLQUEUE["HEALTH"] gives queue_health its defaults; each flag replaces one of them."""
    with override_settings(SQLQUEUE={**SETTINGS, "HEALTH": {"MAX_LAG": 3, "MAX_DEAD_LETTERS": 2}}):
        status, lines = health("--group", "billing")
        assert (status, lines) == (
            1,
            [
                "lag group=billing topic=orders value=4 max=3",
                "dead_letters group=billing topic=orders value=3 max=2",
            ],
        )
        status, lines = health("--group", "billing", "--max-lag", "10")
        assert (status, lines) == (1, ["dead_letters group=billing topic=orders value=3 max=2"])
    with override_settings(SQLQUEUE={**SETTINGS, "HEALTH": {"REQUIRE_SUBSCRIBERS": True}}):
        status, lines = health()
        assert (status, lines) == (1, ["subscribers group=retired topic=orders value=0 min=1"])


def test_the_overview_problems_are_the_commands_lines():
    from django_sqlqueue.ops.health import Thresholds, check_health, dead_letter_cap, overview_problems

    thresholds = Thresholds(max_lag=3, require_subscribers=True)
    overview = ops.overview(cap=dead_letter_cap(thresholds))
    found = overview_problems(overview, thresholds)
    assert [p.line for p in found] == [p.line for p in check_health(thresholds).problems]
    assert [p.text for p in found] == [
        "group billing on orders is 4 message(s) behind (HEALTH MAX_LAG 3)",
        "group retired on orders is 20 message(s) behind (HEALTH MAX_LAG 3)",
        "group retired on orders has no live subscriber (HEALTH REQUIRE_SUBSCRIBERS)",
    ]


@pytest.mark.parametrize(
    ("health_setting", "message"),
    [
        ([1], "SQLQUEUE['HEALTH'] must be a dict, not list."),
        ({"MAX_LAGG": 1}, "SQLQUEUE['HEALTH'] has unknown key(s): MAX_LAGG."),
        ({"MAX_LAG": -1}, "SQLQUEUE['HEALTH']['MAX_LAG'] must be an integer >= 0, got -1."),
        ({"MAX_LAG": True}, "SQLQUEUE['HEALTH']['MAX_LAG'] must be an integer >= 0, got True."),
        (
            {"MAX_LAG_SECONDS": "5m"},
            "SQLQUEUE['HEALTH']['MAX_LAG_SECONDS'] must be a number of seconds >= 0, got '5m'.",
        ),
        ({"REQUIRE_SUBSCRIBERS": 1}, "SQLQUEUE['HEALTH']['REQUIRE_SUBSCRIBERS'] must be True or False, got 1."),
    ],
)
def test_a_bad_health_setting_is_the_system_check_e013(health_setting, message):
    from django_sqlqueue.conf import validate

    problems = validate({"HEALTH": health_setting})
    assert [(p.id, p.msg) for p in problems] == [("sqlqueue.E013", message)]

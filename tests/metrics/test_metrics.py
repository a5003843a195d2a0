"""django_sqlqueue.metrics: the queue gauges view (token, staff login, cache, constant statements).

The scene (tests/support/console_scene.py): on ``orders`` (2 partitions) ``billing`` is 2 behind per
partition with a live subscriber, 2 leases and 3 dead letters, ``shipping`` caught up with
1 dead letter, ``retired`` 10 behind per partition with no subscriber. Real database, the
test client against the project's URLconf (testproject/urls.py mounts the view).
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from django_sqlqueue import ops, publish_many
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.metrics import views
from django_sqlqueue.metrics.gauges import read_snapshot

from ..support.console_scene import SETTINGS, build, dead_letter

pytestmark = [pytest.mark.django_db(transaction=True)]

TOKEN = "s3cret-token-for-the-scraper"
URL = "/sqlqueue/metrics"


@pytest.fixture(autouse=True)
def scene():
    views.clear_cache()
    with override_settings(SQLQUEUE={**SETTINGS, "METRICS_TOKEN": TOKEN}):
        build()
        yield
    views.clear_cache()


def samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(name, sorted labels): value}`` of an exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(found, name: str, database: str = "default", **labels: str) -> float:
    return found[(name, tuple(sorted({"database": database, **labels}.items())))]


def test_the_token_scrapes_every_gauge(client):
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    found = samples(response.content.decode())
    for part in ("0", "1"):
        assert value(found, "sqlqueue_consumergroup_lag", group="billing", topic="orders", partition=part) == 2
        assert value(found, "sqlqueue_consumergroup_lag", group="shipping", topic="orders", partition=part) == 0
        assert value(found, "sqlqueue_consumergroup_lag", group="retired", topic="orders", partition=part) == 10
    assert value(found, "sqlqueue_dead_letters", group="billing", topic="orders") == 3
    assert value(found, "sqlqueue_dead_letters", group="shipping", topic="orders") == 1
    assert value(found, "sqlqueue_dead_letters", group="retired", topic="orders") == 0
    assert value(found, "sqlqueue_live_subscribers", group="billing", topic="orders") == 1
    assert value(found, "sqlqueue_live_subscribers", group="retired", topic="orders") == 0
    assert value(found, "sqlqueue_leased_partitions", group="billing", topic="orders") == 2
    assert value(found, "sqlqueue_leased_partitions", group="shipping", topic="orders") == 0
    assert value(found, "sqlqueue_consumergroup_paused", group="billing", topic="orders") == 0
    assert value(found, "sqlqueue_consumergroup_lag_seconds", group="shipping", topic="orders") == 0
    assert value(found, "sqlqueue_consumergroup_lag_seconds", group="billing", topic="orders") >= 0
    assert value(found, "sqlqueue_topic_unsequenced_messages", topic="orders") == 0
    # Bounded labels: database, group, topic, partition only.
    assert {k for (_, labels) in found for k, _ in labels} <= {"database", "group", "topic", "partition"}
    assert value(found, "sqlqueue_database_up") == 1


def test_lag_seconds_is_the_health_checks_number(client):
    from ..ops.test_health import age_orders

    age_orders(600)
    found = samples(client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode())
    # 599, not 600: SQLite's clock has milliseconds, so a scrape within a millisecond of
    # age_orders() (Python's microseconds) can read 599.9998.
    assert 599 <= value(found, "sqlqueue_consumergroup_lag_seconds", group="billing", topic="orders") < 700
    assert value(found, "sqlqueue_consumergroup_lag_seconds", group="shipping", topic="orders") == 0


def test_unsequenced_paused_and_a_wrong_token(client):
    ops.pause("retired", "orders", reason="retiring")
    publish_many("orders", [{"payload": {"n": i}, "key": "k1"} for i in range(5)])
    assert client.get(URL, HTTP_AUTHORIZATION="Bearer wrong-token-wrong-token").status_code == 403
    found = samples(client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode())
    assert value(found, "sqlqueue_consumergroup_paused", group="retired", topic="orders") == 1
    assert value(found, "sqlqueue_topic_unsequenced_messages", topic="orders") == 5
    # The unsequenced messages are lag too (store.lag).
    lag = sum(
        value(found, "sqlqueue_consumergroup_lag", group="shipping", topic="orders", partition=p) for p in ("0", "1")
    )
    assert lag == 5


def test_without_token_or_staff_it_is_forbidden(client):
    assert client.get(URL).status_code == 403
    assert client.get(URL, HTTP_AUTHORIZATION=TOKEN).status_code == 403  # not a Bearer header
    User.objects.create_user("alice", password="pw")
    client.login(username="alice", password="pw")
    assert client.get(URL).status_code == 403
    assert client.post(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_a_staff_login_scrapes_without_token(client):
    with override_settings(SQLQUEUE=SETTINGS):  # no METRICS_TOKEN: staff only
        assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 403
        bob = User.objects.create_user("bob", password="pw", is_staff=True)
        bob.user_permissions.add(Permission.objects.get(codename="view_queue"))  # the console's permission
        client.login(username="bob", password="pw")
        response = client.get(URL)
        assert response.status_code == 200
        assert b"sqlqueue_consumergroup_lag{" in response.content


def test_scrapes_within_the_cache_window_read_the_database_once(client):
    with CaptureQueriesContext(connection) as first:
        client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert len(first.captured_queries) > 0
    with CaptureQueriesContext(connection) as again:
        for _ in range(5):
            assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert again.captured_queries == []


def test_a_scrape_costs_a_constant_number_of_statements():
    with CaptureQueriesContext(connection) as small:
        read_snapshot()
    # Many more groups, topics, partitions and dead letters.
    for topic in ("a.one", "a.two", "a.three"):
        publish_many(topic, [{"payload": {"n": i}, "key": f"k{i}"} for i in range(30)])
        sequence(topic)
    for i in range(6):
        for topic in ("orders", "a.one", "a.two", "a.three"):
            ops.pause(f"g{i}", topic)
    for i in range(4):
        dead_letter(f"g{i}", f"x{i}", topic="a.one")
    with CaptureQueriesContext(connection) as big:
        snapshot = read_snapshot()
    assert len(snapshot.groups) == 3 + 24
    assert len(big.captured_queries) == len(small.captured_queries), [q["sql"] for q in big.captured_queries]
    assert len(small.captured_queries) <= 20


def test_without_the_extra_the_view_answers_404_with_the_install_hint():
    """A Python where ``import prometheus_client`` fails (``sys.modules`` entry None): the URLconf
    still imports, and the view says what to install."""
    import subprocess
    import sys

    from ..support.processes import ROOT, database_url

    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "import django; django.setup()\n"
        "from django.test import Client\n"
        "r = Client(raise_request_exception=False).get('/sqlqueue/metrics')\n"
        "print(r.status_code, r.content.decode())\n"
        "from django_sqlqueue.metrics import require_prometheus_client\n"
        "try:\n    require_prometheus_client()\nexcept Exception as exc:\n    print(exc)\n"
    )
    env = {
        **__import__("os").environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings",
        "DATABASE_URL": database_url(),
    }
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    response, message = out.stdout.splitlines()[:2]
    hint = "pip install 'django-sqlqueue[prometheus]'"
    assert response == f"404 sqlqueue metrics need the prometheus-client package: {hint}"
    assert "pip install 'django-sqlqueue[prometheus]'" in message

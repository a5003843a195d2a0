"""The SQLQUEUE settings dict and its system checks."""

from __future__ import annotations

import pytest
from django.core import checks
from django.test import override_settings

from django_sqlqueue import ConfigurationError, SQLQueueError, publish
from django_sqlqueue.conf import DEFAULT_BATCH_SIZE, QueueSettings, get_settings


def sqlqueue_errors(**extra) -> list[str]:
    return [m.id for m in checks.run_checks(tags=["sqlqueue"]) if m.id.startswith("sqlqueue.")]


def test_defaults():
    with override_settings(SQLQUEUE={}):
        conf = get_settings()
    assert conf == QueueSettings()
    assert conf.BATCH_SIZE == DEFAULT_BATCH_SIZE == 10
    assert conf.DLQ_SUFFIX == "_dlq"
    assert conf.MAX_PAYLOAD_BYTES == 256 * 1024
    assert conf.DATABASE == "default"
    assert conf.STATS_RETENTION == 30 * 24 * 3600.0


def test_override_is_picked_up_and_durations_are_floats():
    with override_settings(SQLQUEUE={"BATCH_SIZE": 100, "LEASE_DURATION": 45}):
        assert get_settings().BATCH_SIZE == 100
        assert get_settings().LEASE_DURATION == 45.0
    assert get_settings().BATCH_SIZE == DEFAULT_BATCH_SIZE


@pytest.mark.parametrize(
    ("value", "check_id"),
    [
        ("nope", "sqlqueue.E001"),
        ({"BATCH_SIZ": 5}, "sqlqueue.E002"),
        ({"POLL_INTERVAL": 0}, "sqlqueue.E003"),
        ({"VISIBILITY_TIMEOUT": "30"}, "sqlqueue.E003"),
        ({"STATS_RETENTION": 0}, "sqlqueue.E003"),
        ({"STATS_RETENTION": None}, "sqlqueue.E003"),
        ({"HISTORY_RETENTION": -1}, "sqlqueue.E003"),
        ({"HISTORY_RETENTION": "7d"}, "sqlqueue.E003"),
        ({"MAX_ATTEMPTS": 0}, "sqlqueue.E004"),
        ({"BATCH_SIZE": 2.5}, "sqlqueue.E004"),
        ({"MAX_PAYLOAD_BYTES": True}, "sqlqueue.E004"),
        ({"DLQ_SUFFIX": ""}, "sqlqueue.E005"),
        ({"DLQ_SUFFIX": "/dead"}, "sqlqueue.E005"),
        ({"DATABASE": "missing"}, "sqlqueue.E006"),
        ({"LEASE_DURATION": 10, "LEASE_RENEW_INTERVAL": 10}, "sqlqueue.E007"),
        ({"PARTITIONS": 0}, "sqlqueue.E004"),
        ({"PARTITIONS": 4097}, "sqlqueue.E004"),
        ({"TOPICS": ["orders"]}, "sqlqueue.E009"),
        ({"TOPICS": {"bad topic": {"partitions": 2}}}, "sqlqueue.E009"),
        ({"TOPICS": {"orders": 4}}, "sqlqueue.E009"),
        ({"TOPICS": {"orders": {"shards": 4}}}, "sqlqueue.E009"),
        ({"TOPICS": {"orders": {"partitions": 0}}}, "sqlqueue.E009"),
        ({"TOPICS": {"orders": {"partitions": True}}}, "sqlqueue.E009"),
        ({"TOPICS": {"orders": {"per_key": "yes"}}}, "sqlqueue.E009"),
        ({"TOPICS": {"orders": {"per_key": True, "partitions": 4}}}, "sqlqueue.E009"),
    ],
)
def test_invalid_settings_are_reported_by_checks_and_refused(value, check_id):
    with override_settings(SQLQUEUE=value):
        assert check_id in sqlqueue_errors()
        with pytest.raises(ConfigurationError, match=check_id):
            get_settings()
        with pytest.raises(SQLQueueError):
            publish("t", 1)  # refused before touching the database


def test_partitions_per_topic():
    topics = {"orders": {"partitions": 16}, "tenants": {"per_key": True}, "flat": {"per_key": False}}
    with override_settings(SQLQUEUE={"PARTITIONS": 4, "TOPICS": topics}):
        conf = get_settings()
    assert conf.partitions_for("orders") == 16
    assert conf.partitions_for("tenants") is None  # one partition per key
    assert conf.partitions_for("flat") == 4
    assert conf.partitions_for("other") == 4
    assert conf.partitions_for("orders_dlq") == 4  # a DLQ topic not listed: the default
    assert QueueSettings().partitions_for("other") == 8


def test_unknown_key_message_names_the_key():
    with override_settings(SQLQUEUE={"BATCH_SIZ": 5}):
        (error,) = [m for m in checks.run_checks(tags=["sqlqueue"]) if m.id == "sqlqueue.E002"]
    assert "BATCH_SIZ" in error.msg and "BATCH_SIZE" in error.hint


def test_valid_project_settings_pass_checks():
    assert sqlqueue_errors() == []


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_mysql_connection_without_read_committed_warns(settings):
    from django.db import connections

    if connections["default"].vendor != "mysql":
        pytest.skip("MySQL-only check")
    databases = {"default": {**settings.DATABASES["default"], "OPTIONS": {"charset": "utf8mb4"}}}
    with override_settings(DATABASES=databases):
        assert "sqlqueue.W001" in sqlqueue_errors()


@pytest.mark.parametrize("token", ["", "short", 12345678901234567890, "sixteen chars\n..", ["x" * 20]])
def test_a_bad_metrics_token_is_refused(token):
    from django_sqlqueue.conf import validate

    assert [p.id for p in validate({"METRICS_TOKEN": token})] == ["sqlqueue.E012"]


@pytest.mark.parametrize(
    "token",
    [
        "ñandú-tökén-0123456789",  # passes isprintable(); a UTF-8 header never matches it (WSGI: Latin-1)
        "a token with spaces in it",
        "tab\tseparated-token-0123",
        "nbsp\u00a0separated-token-0123",
        "c1-control\u0085-token-0123",
        "bidi-\u202e-override-token-0123",
        "fullwidth-ｔｏｋｅｎ-0123456789",
        " leading-space-token-0123",
    ],
)
def test_a_metrics_token_a_header_cannot_carry_is_refused(token):
    """Issue 28 (F9): only printable ASCII without spaces; before, any printable text passed."""
    from django_sqlqueue.conf import validate

    (problem,) = validate({"METRICS_TOKEN": token})
    assert problem.id == "sqlqueue.E012" and "printable ASCII characters without spaces" in problem.msg
    assert "non-ASCII" in problem.msg


@pytest.mark.parametrize(
    "token", [None, "x" * 16, "a-long-random-token_0123456789", "~!#$%&'*+/=?^`{|}\"\\<>()[]:;@,.0123"]
)
def test_a_metrics_token_or_none_is_accepted(token):
    from django_sqlqueue.conf import validate

    assert validate({"METRICS_TOKEN": token}) == []


@pytest.mark.parametrize("flag", ["NOTIFY", "PREPARED_STATEMENTS", "SYNCHRONOUS_ACKS"])
def test_a_flag_that_is_not_a_bool_is_refused(flag):
    from django_sqlqueue.conf import validate

    problems = validate({flag: "yes"})
    assert [p.id for p in problems] == ["sqlqueue.E014"]
    assert f"SQLQUEUE['{flag}'] must be True or False, got 'yes'." == problems[0].msg

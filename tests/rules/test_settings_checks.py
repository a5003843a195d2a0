"""The nested settings checks (rules/settings_checks.py): each finding names the key and has its check id."""

from __future__ import annotations

from django_sqlqueue.rules.settings_checks import MAX_PARTITIONS, is_seconds, validate_health, validate_topics


def test_topic_options_are_checked_entry_by_entry() -> None:
    assert validate_topics({"orders": {"partitions": 16}, "tenants": {"per_key": True}}) == []
    problems = validate_topics({"orders": {"partitions": MAX_PARTITIONS + 1}, "bad topic": {}, "x": {"nope": 1}})
    assert {p.id for p in problems} == {"sqlqueue.E009"}
    text = " ".join(p.msg for p in problems)
    assert "'orders'" in text and "'bad topic'" in text and "nope" in text
    assert validate_topics([])[0].msg.startswith("SQLQUEUE['TOPICS'] must be a dict")


def test_health_thresholds_are_checked_by_kind() -> None:
    assert validate_health({"MAX_LAG": 10, "MAX_LAG_SECONDS": 1.5, "REQUIRE_SUBSCRIBERS": False}) == []
    problems = validate_health({"MAX_LAG": -1, "REQUIRE_SUBSCRIBERS": 1, "OTHER": 2})
    assert [p.id for p in problems] == ["sqlqueue.E013"] * 3
    assert is_seconds(0, zero=True) and not is_seconds(0) and not is_seconds(float("inf"))

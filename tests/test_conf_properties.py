"""The SQLQUEUE setting under arbitrary values (Hypothesis).

The property: ``conf.validate()`` returns problems with stable ids (or nothing) for any
value; ``get_settings()`` returns settings exactly when there is no problem and raises
``ConfigurationError`` (naming every problem's id) otherwise; the system checks report the
same ids. No value makes any of them raise anything else.
"""

from __future__ import annotations

import math
import re

import pytest
from django.core import checks
from django.test import override_settings
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_sqlqueue import ConfigurationError
from django_sqlqueue.conf import DURATION_KEYS, KNOWN_KEYS, MAX_PARTITIONS, QueueSettings, get_settings, validate

from .support import strategies as s

ID = re.compile(r"^sqlqueue\.E0(0[1-9]|1[0-4]|16)$")


def values() -> st.SearchStrategy:
    """Anything a settings file could hold, biased towards the edges of what is valid."""
    return st.one_of(
        s.wild_scalars(),
        st.integers(min_value=-2, max_value=MAX_PARTITIONS + 2),
        st.floats(min_value=-1, max_value=1e12),
        st.sampled_from([0, 0.0, 1, 1.5, 30, 4096, 4097, 1e300, math.inf, -math.inf, math.nan, True, False]),
        s.nasty_text(40),
        st.sampled_from(["default", "other", "_dlq", ".dead", "x" * 33]),
        st.lists(st.integers(), max_size=2),
    )


def topic_options() -> st.SearchStrategy:
    option = st.one_of(st.sampled_from(["partitions", "per_key"]), st.text(max_size=8), st.integers())
    return st.one_of(st.dictionaries(option, values(), max_size=3), values())


def schedules() -> st.SearchStrategy:
    spec_key = st.one_of(
        st.sampled_from(
            ["cron", "task", "topic", "payload", "key", "args", "kwargs", "timezone", "catch_up", "unknown"]
        ),
        st.integers(),
    )
    spec_value = st.one_of(
        values(),
        st.sampled_from(["* * * * *", "0 0 * * * *", "61 * * * *", "tasks.ping", "orders", "Europe/Paris", "../x"]),
        st.sampled_from(["a" * 300, "Zone\x00", "\ud800", math.nan, math.inf]),
        s.any_payload(),
    )
    spec = st.dictionaries(spec_key, spec_value, max_size=6)
    return st.one_of(st.dictionaries(st.one_of(st.text(max_size=10), st.integers()), spec, max_size=2), values())


def raw_settings() -> st.SearchStrategy:
    known = st.sampled_from(sorted(KNOWN_KEYS - {"TOPICS", "SCHEDULES"}))
    entries = st.one_of(
        st.tuples(known, values()),
        st.tuples(st.just("TOPICS"), st.one_of(st.dictionaries(s.any_topic(), topic_options(), max_size=3), values())),
        st.tuples(st.just("SCHEDULES"), schedules()),
        st.tuples(st.one_of(st.text(max_size=12), st.integers(), st.none(), st.tuples(st.integers())), values()),
    )
    return st.one_of(st.lists(entries, max_size=6).map(dict), values())


def check_ids() -> list[str]:
    return sorted({m.id for m in checks.run_checks(tags=["sqlqueue"]) if m.id.startswith("sqlqueue.E")})


@settings(max_examples=300)
@given(raw=raw_settings())
@example(raw={1: 1, "a": 2})
@example(raw={"TOPICS": {"orders": {1: 1, "x": 2}}})
@example(raw={"SCHEDULES": {"s": {1: 1, "x": 2}}})
@example(raw={"DATABASE": ["default"]})
@example(raw={"POLL_INTERVAL": math.inf, "POLL_INTERVAL_MAX": math.inf})
@example(raw={"LEASE_DURATION": 1e300})
@example(raw={"DLQ_SUFFIX": "_dlq\n"})
@example(raw={"TOPICS": {"orders\n": {"partitions": 2}}})
@example(raw=[])
@example(raw=0)
@example(raw={"SCHEDULES": {"s": {"cron": "* * * * *", "topic": "t", "payload": {1, 2}}}})
@example(raw={"SCHEDULES": {"s": {"cron": "* * * * *", "task": "a.b", "catch_up": math.nan}}})
@example(raw={"SCHEDULES": {"s": {"cron": "* * * * *", "task": "a.b", "timezone": "\ud800"}}})
def test_any_setting_is_accepted_or_refused_with_check_ids(raw):
    problems = validate(raw)
    assert all(ID.match(p.id) and p.msg for p in problems), problems
    with override_settings(SQLQUEUE=raw):
        if problems:
            with pytest.raises(ConfigurationError) as caught:
                get_settings()
            assert {p.id for p in problems} <= set(re.findall(r"sqlqueue\.E\d{3}", str(caught.value)))
        else:
            conf = get_settings()
            assert isinstance(conf, QueueSettings)
            assert re.fullmatch(r"[A-Za-z0-9._-]{1,32}", conf.DLQ_SUFFIX), conf.DLQ_SUFFIX
            assert all(re.fullmatch(r"[A-Za-z0-9._-]{1,160}", topic) for topic in conf.TOPICS), conf.TOPICS
            for key in DURATION_KEYS:
                value = getattr(conf, key)
                assert isinstance(value, float) and math.isfinite(value) and value >= 0
        assert check_ids() == sorted({p.id for p in problems})

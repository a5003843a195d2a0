"""Rate strings and limit names (django_sqlqueue/rules/rates.py)."""

from __future__ import annotations

import pytest

from django_sqlqueue import ConfigurationError
from django_sqlqueue.rules.rates import MAX_NAME_LENGTH, Limits, limit_name, parse_concurrency, parse_rate


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [("20/s", 20, 1.0), ("5/m", 5, 60.0), ("100/h", 100, 3600.0), ("30/10s", 30, 10.0), (" 2 / minute ", 2, 60.0)],
)
def test_rates_parse_to_a_count_per_period(text: str, count: int, period: float) -> None:
    rate = parse_rate(text)
    assert (rate.count, rate.period, rate.burst, rate.interval) == (count, period, 1, period / count)


@pytest.mark.parametrize(
    ("text", "burst", "message"),
    [
        ("20/d", 1, "unknown period 'd'"),
        ("-1/s", 1, "is not '<count>/<period>'"),
        ("0/s", 1, "must be above zero"),
        ("5/0s", 1, "must be above zero"),
        ("1.5/s", 1, "is not '<count>/<period>'"),
        (None, 1, "is a string like '20/s'"),
        ("5/s", 0, "burst must be a whole number of at least 1"),
        ("5/s", True, "burst must be a whole number of at least 1"),
    ],
)
def test_bad_rates_name_the_problem(text: object, burst: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_rate(text, burst)
    with pytest.raises(ConfigurationError, match=f"consumer g:t: .*{message}"):
        parse_rate(text, burst, where="consumer g:t")


def test_concurrency_limits_and_names() -> None:
    assert parse_concurrency(3) == 3
    with pytest.raises(ConfigurationError):
        parse_concurrency(0)
    assert limit_name("task", "rate", "a.b", "k") == "task:rate:a.b:k"
    long_a, long_b = limit_name("x" * 300, "a"), limit_name("x" * 300, "b")
    assert len(long_a) == MAX_NAME_LENGTH and long_a != long_b
    assert not Limits() and Limits(concurrency=("c", 1))
    both = Limits(rates=(("r", parse_rate("1/s")),)) + Limits(concurrency=("c", 2))
    assert both.rates[0][0] == "r" and both.concurrency == ("c", 2)

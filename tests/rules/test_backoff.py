"""retry_delay: exponential growth, +/-20% jitter, the maximum, determinism."""

from __future__ import annotations

import itertools
import random

import pytest

from django_sqlqueue.rules.backoff import JITTER, retry_delay


def test_jitter_is_twenty_percent():
    assert JITTER == 0.2


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5, 6])
def test_delay_is_exponential_within_jitter(attempt):
    rng = random.Random(attempt)
    base = 0.5 * 2 ** (attempt - 1)
    delays = [retry_delay(attempt, 0.5, 10_000, rng) for _ in range(500)]
    assert all(base * 0.8 <= d <= base * 1.2 for d in delays)
    # The jitter is real: the delays spread over most of the +/-20% band.
    assert min(delays) < base * 0.85 and max(delays) > base * 1.15
    assert len(set(delays)) > 400


def test_delay_grows_with_attempts():
    rng = random.Random(7)
    means = [sum(retry_delay(a, 1, 10_000, rng) for _ in range(200)) / 200 for a in range(1, 9)]
    for lower, higher in itertools.pairwise(means):
        assert higher / lower == pytest.approx(2, rel=0.1)
    # Jitter never reorders attempts: attempt 3 at its shortest (3.2s) beats attempt 2 at its longest.
    assert min(retry_delay(3, 1, 1000, rng) for _ in range(200)) > max(retry_delay(2, 1, 1000, rng) for _ in range(200))


@pytest.mark.parametrize("attempt", [1, 5, 9, 20, 63, 64, 1000, 10**9])
def test_delay_never_exceeds_the_maximum(attempt):
    rng = random.Random(attempt)
    for _ in range(200):
        d = retry_delay(attempt, 1, 300, rng)
        assert 0 < d <= 300
    # Far past the cap, no overflow, and still jittered: delays that failed together spread
    # over [0.8 * maximum, maximum] instead of all coming back at exactly the maximum.
    capped = {retry_delay(1000, 1, 300, random.Random(seed)) for seed in range(50)}
    assert all(240 <= d <= 300 for d in capped)
    assert len(capped) == 50 and max(capped) - min(capped) > 30


def test_attempt_below_one_uses_the_minimum():
    rng = random.Random(3)
    for attempt in (0, -5):
        assert 0.8 <= retry_delay(attempt, 1, 300, rng) <= 1.2


def test_seeded_random_is_deterministic():
    first = [retry_delay(a, 0.05, 0.2, random.Random(42)) for a in range(1, 6)]
    second = [retry_delay(a, 0.05, 0.2, random.Random(42)) for a in range(1, 6)]
    assert first == second
    rng1, rng2 = random.Random(99), random.Random(99)
    assert [retry_delay(2, 1, 60, rng1) for _ in range(20)] == [retry_delay(2, 1, 60, rng2) for _ in range(20)]
    assert [retry_delay(2, 1, 60, random.Random(1)) for _ in range(3)] != [
        retry_delay(2, 1, 60, random.Random(2)) for _ in range(3)
    ]


def test_without_rng_uses_module_random():
    random.seed(5)
    a = retry_delay(2, 1, 60)
    random.seed(5)
    assert retry_delay(2, 1, 60) == a
    assert 1.6 <= a <= 2.4

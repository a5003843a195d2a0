"""Retry delays after a failed handler: exponential, with jitter, bounded by settings."""

from __future__ import annotations

import random

#: Each delay is scaled by a random factor in [1 - JITTER, 1 + JITTER], so messages that
#: failed together do not all come back together.
JITTER = 0.2


def retry_delay(attempt: int, minimum: float, maximum: float, rng: random.Random | None = None) -> float:
    """Return the delay before retrying after failed attempt number ``attempt`` (1-based).

    ``minimum * 2 ** (attempt - 1)``, capped at ``maximum``, jittered by +/-20%. A value
    the jitter pushes above ``maximum`` is reflected below it, so delays at the cap
    still spread over [0.8 * maximum, maximum] instead of all equalling ``maximum``.
    """
    base = min(maximum, minimum * (2 ** min(max(attempt - 1, 0), 62)))
    delay = base * (1 + (rng or random).uniform(-JITTER, JITTER))
    if delay > maximum:
        delay = 2 * maximum - delay
    return delay

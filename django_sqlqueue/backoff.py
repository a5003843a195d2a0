"""Retry delays after a failed handler: exponential, with jitter, bounded by settings."""

from __future__ import annotations

import random

#: Each delay is scaled by a random factor in [1 - JITTER, 1 + JITTER], so messages that
#: failed together do not all come back together.
JITTER = 0.2


def retry_delay(attempt: int, minimum: float, maximum: float, rng: random.Random | None = None) -> float:
    """Return the delay before retrying after failed attempt number ``attempt`` (1-based).

    ``minimum * 2 ** (attempt - 1)``, jittered by +/-20%, never above ``maximum``.
    """
    base = minimum * (2 ** min(max(attempt - 1, 0), 62))
    factor = 1 + (rng or random).uniform(-JITTER, JITTER)
    return min(maximum, base * factor)

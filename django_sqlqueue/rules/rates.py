"""Rate and concurrency limits as values: ``"20/s"`` parsed, and what a message is limited by.

The one parser of a rate string, shared by ``@consumer(rate_limit=...)`` (``consumers.py``)
and the tasks' ``@rate_limit`` (``tasks/limits.py``); the worker enforces what it returns
(``worker/limits.py``). A leaf: it imports only ``django_sqlqueue.exceptions``.

A rate is ``"<count>/<period>"``: a positive whole count, a period of ``s``, ``m`` or ``h``
(also ``sec``/``second``, ``min``/``minute``, ``hour``), optionally with a whole multiple
(``"100/10s"``, ``"5/2m"``). It is enforced as GCRA (the generic cell rate algorithm): the
admissions are spaced ``period / count`` apart (the *emission interval*), and ``burst`` of
them may come at once after a quiet spell -- so over any window of length ``period`` at most
``count + burst - 1`` are admitted. ``burst=1`` (the default) spaces every admission.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from ..exceptions import ConfigurationError

#: Seconds per period unit.
_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
}
_RATE_RE = re.compile(r"\A\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*\Z")

#: Longest limit name (the ``name`` columns of ``queue_rate_limits`` and ``queue_concurrency_slots``).
MAX_NAME_LENGTH = 255


@dataclass(frozen=True)
class Rate:
    """A parsed rate: ``count`` admissions per ``period`` seconds, ``burst`` of them at once."""

    count: int
    period: float
    burst: int = 1
    #: The rate as written (for messages).
    text: str = ""

    @property
    def interval(self) -> float:
        """Seconds between two admissions (the GCRA emission interval)."""
        return self.period / self.count


def parse_rate(text: object, burst: object = 1, where: str = "") -> Rate:
    """Parse ``"20/s"`` (see the module docstring); raise ``ConfigurationError`` naming the
    problem (prefixed by ``where``, e.g. the consumer's name)."""
    try:
        if not isinstance(text, str):
            raise ConfigurationError(f"a rate limit is a string like '20/s', '5/m' or '100/h', got {text!r}.")
        if not isinstance(burst, int) or isinstance(burst, bool) or burst < 1:
            raise ConfigurationError(f"rate limit {text!r}: burst must be a whole number of at least 1, got {burst!r}.")
        return _parse_rate(text, burst)
    except ConfigurationError as exc:
        if not where:
            raise
        raise ConfigurationError(f"{where}: {exc}") from None


@functools.lru_cache(maxsize=256)
def _parse_rate(text: str, burst: int) -> Rate:
    match = _RATE_RE.match(text.lower())
    if match is None:
        raise ConfigurationError(
            f"rate limit {text!r} is not '<count>/<period>': a whole count, '/', and s, m or h "
            "(e.g. '20/s', '5/m', '100/h', '30/10s')."
        )
    count, multiple, unit = int(match[1]), int(match[2] or 1), match[3]
    if unit not in _UNITS:
        raise ConfigurationError(f"rate limit {text!r}: unknown period {unit!r} (use s, m or h).")
    if count <= 0 or multiple <= 0:
        raise ConfigurationError(f"rate limit {text!r}: the count and the period must be above zero.")
    return Rate(count=count, period=multiple * _UNITS[unit], burst=burst, text=text)


def parse_concurrency(limit: object) -> int:
    """Validate a concurrency limit: a whole number of at least 1."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigurationError(f"a concurrency limit is a whole number of at least 1, got {limit!r}.")
    return limit


def limit_name(*parts: str) -> str:
    """The stored name of a limit from its parts (``":"``-joined); a name too long for the
    column keeps its start and ends with a hash of the whole, so distinct names stay distinct."""
    name = ":".join(parts)
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()
    return f"{name[: MAX_NAME_LENGTH - len(digest) - 1]}#{digest}"


@dataclass(frozen=True)
class Limits:
    """What one delivery is limited by (resolved for its message: keys applied)."""

    #: ``(name, rate)`` of each rate limit; the delivery must be admitted by all of them.
    rates: tuple[tuple[str, Rate], ...] = ()
    #: ``(name, n)``: at most ``n`` deliveries of that name run at once (None: no such limit).
    concurrency: tuple[str, int] | None = None

    def __bool__(self) -> bool:
        return bool(self.rates) or self.concurrency is not None

    def __add__(self, other: Limits) -> Limits:
        return Limits(self.rates + other.rates, self.concurrency or other.concurrency)

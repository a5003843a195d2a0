"""rules/atomic_modes.py: the values of ``@consumer(atomic=...)`` and how operators read them."""

from __future__ import annotations

from typing import Any

import pytest

from django_sqlqueue.consumers import ConsumerSpec
from django_sqlqueue.exceptions import ConfigurationError
from django_sqlqueue.rules.atomic_modes import BATCH, describe, validate_atomic


@pytest.mark.parametrize("value", [True, False, "batch"])
def test_the_three_values_are_taken_as_given(value: bool | str) -> None:
    assert validate_atomic(value, "billing:orders") is value


@pytest.mark.parametrize("value", [1, 0, None, "Batch", "per batch", "true"])
def test_anything_else_is_refused_naming_the_consumer(value: Any) -> None:
    # 1 == True and 0 == False, but a truthy number is not an atomic mode.
    with pytest.raises(ConfigurationError, match=r"consumer billing:orders: atomic must be True, False or 'batch'"):
        validate_atomic(value, "billing:orders")


def test_operators_read_no_per_message_or_per_batch() -> None:
    assert [describe(v) for v in (False, True, BATCH)] == ["no", "per message", "per batch"]


def test_a_consumer_spec_is_checked_when_it_is_built() -> None:
    def handle(message: Any) -> None:
        pass

    assert ConsumerSpec(topic="orders", group="billing", handler=handle, atomic=BATCH).atomic == BATCH
    with pytest.raises(ConfigurationError, match="consumer billing:orders: atomic must be"):
        ConsumerSpec(topic="orders", group="billing", handler=handle, atomic=1)

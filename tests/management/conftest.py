"""Fixtures of the management commands' tests (tests/management)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings

from ..support.console_scene import SETTINGS


@pytest.fixture
def scene_settings() -> Iterator[None]:
    """SQLQUEUE of the console scene (tests/support/console_scene.py): ``orders`` has 2 partitions."""
    with override_settings(SQLQUEUE=SETTINGS):
        yield

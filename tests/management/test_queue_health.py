"""management/commands/queue_health.py: its three exit statuses, as the module names them.

Every threshold, the setting's defaults and real processes: tests/ops/test_health.py.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from django_sqlqueue.management.commands import queue_health
from django_sqlqueue.management.commands.queue_health import HEALTHY, UNHEALTHY, UNKNOWN

from ..support.console_scene import build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def health(*args: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    try:
        call_command(queue_health.Command(), *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue().splitlines()
    return HEALTHY, out.getvalue().splitlines()


def test_healthy_unhealthy_and_could_not_check_are_0_1_and_2() -> None:
    build()
    assert (HEALTHY, UNHEALTHY, UNKNOWN) == (0, 1, 2)
    assert health("--group", "shipping", "--max-lag", "0") == (HEALTHY, ["ok: 1 group/topic pair(s) checked"])
    assert health("--group", "billing", "--max-lag", "3") == (
        UNHEALTHY,
        ["lag group=billing topic=orders value=4 max=3"],
    )
    with pytest.raises(CommandError, match="nobody") as failure:
        health("--group", "nobody")
    assert failure.value.returncode == UNKNOWN

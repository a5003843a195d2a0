"""Every command answers every bad argument with one line and a non-zero exit, before it writes
anything (issue 28, items 4 and 5): ``_args.py``'s parser types, run as from the command line.

The property tests run each command in this process the way ``manage.py`` does
(``argspace.run``), over its argument space (``SPACES``): a call with one argument the parser
must refuse -- out of range, not a number, not a time or a name, an unknown option, a missing
value or positional, an unknown subcommand; the other arguments random, ``--yes`` given to the
destructive ones -- exits non-zero with no traceback and leaves every queue table as it was. A
call the parser accepts never prints a traceback either, and writes nothing when it only reads
or is a dry run. One subprocess per command checks the real exit status.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_sqlqueue.management.commands import _args
from django_sqlqueue.ops.pausing import REASON_LENGTH

from ..support.console_scene import build, wm
from ..support.processes import ROOT, database_url
from . import argspace as a
from .argspace import FLAG, GROUP, TEXT, TIME, TOPIC, Choice, Int, Partitions, Seconds, Sub, Text

# Every alias: a command's system checks (Django 6.1's field checks) read each database's
# server version, which only an earlier test that used the alias would have cached.
pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.usefixtures("scene_settings")]

FILTERS = {"--topic": TOPIC, "--group": GROUP, "--error": TEXT, "--failed-after": TIME, "--failed-before": TIME}
BULK = {**FILTERS, "--seq": Int(1, 2**63 - 1), "--all-matching": FLAG, "--batch-size": Int(1, _args.MAX_BATCH)}
DESTRUCTIVE = {"--dry-run": FLAG, "--yes": FLAG, "--json": FLAG}
SPARK = {"--master": TEXT, "--database": Choice(("default", "other")), "--conf": TEXT}
SPACES: dict[str, dict[str | None, Sub]] = {
    "queue_dlq": {
        "list": Sub(options={**FILTERS, "--limit": Int(1, 10_000), "--cursor": Int(1, 2**63 - 1), "--json": FLAG}),
        "replay": Sub(options={**BULK, **DESTRUCTIVE}, writes="dry-run"),
        "purge": Sub(options={**BULK, **DESTRUCTIVE}, writes="dry-run"),
    },
    "queue_gc": {None: Sub(options={"--topic": TOPIC}, writes="yes")},
    "queue_group": {
        "list": Sub(options={"--group": GROUP, "--topic": TOPIC, "--partitions": FLAG, "--json": FLAG}),
        "pause": Sub((GROUP, TOPIC), {"--reason": Text(REASON_LENGTH), "--json": FLAG}, writes="yes"),
        "resume": Sub((GROUP, TOPIC), {"--json": FLAG}, writes="yes"),
        "drop": Sub((GROUP,), {"--topic": TOPIC, "--force": FLAG, **DESTRUCTIVE}, writes="dry-run"),
        "seek": Sub(
            (GROUP, TOPIC),
            {
                "--to-offset": Int(0, 2**63 - 1),
                "--to-time": TIME,
                "--to-earliest": FLAG,
                "--to-latest": FLAG,
                "--partitions": Partitions(),
                **DESTRUCTIVE,
            },
            one_of=("--to-offset", "--to-time", "--to-earliest", "--to-latest"),
            writes="dry-run",
        ),
    },
    "queue_health": {
        None: Sub(
            options={
                "--group": GROUP,
                "--topic": TOPIC,
                "--max-lag": Int(0, 2**63 - 1),
                "--max-lag-seconds": Seconds(),
                "--max-dead-letters": Int(0, 2**63 - 1),
                "--require-subscribers": FLAG,
            }
        )
    },
    "queue_pipeline": {
        "backfill": Sub(
            (TEXT,),
            {
                "--topic": TOPIC,
                "--format": Choice(("parquet", "json", "csv")),
                "--id-column": TEXT,
                "--batch-size": Int(1, _args.MAX_BATCH),
                **SPARK,
            },
            required=("--topic",),
        ),
        "export": Sub(
            options={"--topic": TOPIC, "--output": TEXT, "--since": TIME, "--until": TIME, "--dlq": FLAG, **SPARK},
            required=("--topic", "--output"),
        ),
        "replay": Sub(
            options={"--topic": TOPIC, "--since": TIME, "--to-topic": TOPIC, "--group": GROUP, **SPARK},
            required=("--topic", "--since"),
            one_of=("--to-topic", "--group"),
        ),
        "report": Sub(
            options={"--output": TEXT, "--hours": Int(1, _args.MAX_REPORT_HOURS), **SPARK},
            required=("--output",),
        ),
    },
    "queue_prune_task_results": {
        None: Sub(options={"--older-than": Seconds(), "--backend": TEXT, "--dry-run": FLAG}, writes="dry-run")
    },
    "queue_status": {None: Sub(options={"--group": GROUP, "--topic": TOPIC, "--json": FLAG})},
    "queue_topic": {
        "list": Sub(options={"--unconsumed": FLAG, "--json": FLAG}),
        "purge": Sub((TOPIC,), {"--batch-size": Int(1, _args.MAX_BATCH), **DESTRUCTIVE}, writes="dry-run"),
        "repartition": Sub((TOPIC, Int(1, _args.MAX_PARTITIONS)), dict(DESTRUCTIVE), writes="dry-run"),
    },
    # Never run with arguments the parser accepts here: it would start a worker.
    "runconsumer": {
        None: Sub(
            options={
                "--group": GROUP,
                "--topic": TOPIC,
                "--name": Text(255),
                "--concurrency": Int(1, _args.MAX_CONCURRENCY),
                "--metrics-port": Int(1, 65535),
                "--health-file": TEXT,
                "--no-schedules": FLAG,
            }
        )
    },
}
COMMANDS = sorted(SPACES)
SPARK_INSTALLED = importlib.util.find_spec("pyspark") is not None


def refused(status: int, err: str) -> None:
    """A refusal: non-zero, no traceback, and the last line names the problem."""
    assert status != 0
    assert "Traceback" not in err
    # The line may wrap: argparse repeats an unrecognized argument as it was typed.
    assert any(line.startswith("CommandError: ") or ": error: " in line for line in err.splitlines()), err


@pytest.fixture
def scene() -> Callable[[], dict[str, list[str]]]:
    build()
    return a.snapshot


@pytest.mark.parametrize("command", COMMANDS)
def test_a_call_with_a_bad_argument_is_refused_before_anything_is_written(command: str, scene: Callable) -> None:
    before = scene()

    @settings(max_examples=50)
    @given(argv=a.invalid_argv(SPACES[command]))
    def check(argv: list[str]) -> None:
        status, _, err = a.run(command, *argv)
        refused(status, err)
        assert scene() == before

    check()


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "runconsumer"])
def test_a_call_the_parser_accepts_prints_no_traceback(command: str, scene: Callable) -> None:
    space = SPACES[command]
    if command == "queue_pipeline" and SPARK_INSTALLED:  # never start Spark here
        space = {"replay": Sub(**{**vars(space["replay"]), "one_of": ("--group",)})}

    @settings(max_examples=25)
    @given(call=a.valid_argv(space))
    def check(call: tuple[str | None, list[str]]) -> None:
        name, argv = call
        before = scene()
        status, _, err = a.run(command, *argv)
        assert "Traceback" not in err
        unhealthy = command == "queue_health" and status == 1  # its problems are on stdout
        if status != 0 and not unhealthy:
            refused(status, err)
        if space[name].writes != "yes":
            assert scene() == before

    check()


# -- the cases of the security review (SECURITY-REVIEW.md F8, issue 28 items 4 and 5) ------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["queue_dlq", "list", "--limit", "-5"], "argument --limit: must be an integer from 1 to 10000, got '-5'"),
        (["queue_dlq", "list", "--limit", str(10**23)], "argument --limit: must be an integer from 1 to 10000"),
        (["queue_dlq", "list", "--cursor", str(2**63)], "argument --cursor: must be an integer from 1 to"),
        (["queue_dlq", "replay", "--seq", "1", "--batch-size", "0", "--yes"], "argument --batch-size: must be"),
        (["queue_dlq", "purge", "--seq", "1", "--batch-size", "0", "--dry-run"], "argument --batch-size: must be"),
        (["queue_dlq", "purge", "--all-matching", "--batch-size", "-3", "--yes"], "argument --batch-size: must be"),
        (["queue_health", "--max-dead-letters", str(10**23)], "--max-dead-letters must be at most"),
        (["queue_health", "--max-lag-seconds", "inf"], "--max-lag-seconds must be at most 3153600000"),
        (["queue_prune_task_results", "--older-than", "nan"], "argument --older-than: must be a number from 0"),
        (["queue_group", "seek", "billing", "orders", "--to-offset", "1", "--partitions", "0," * 300_000], "argument"),
        (["queue_group", "pause", "billing", "orders", "--reason", "r" * 501], "argument --reason: must be at most"),
        (["queue_gc", "--topic", "<script>"], "argument --topic: must be a topic"),
        (["queue_status", "--group", "a\u202eb"], r"argument --group: must be a consumer group"),
        (["queue_pipeline", "export"], "the following arguments are required: --topic, --output"),
        (["queue_pipeline", "backfill", "x", "--topic", "t", "--batch-size", "0"], "argument --batch-size: must"),
        (["queue_pipeline", "replay", "--topic", "orders", "--since", "garbage", "--group", "g"], "ISO 8601"),
        (["queue_pipeline", "report", "--output", "r.html", "--hours", "0"], "argument --hours: must be"),
        (["queue_pipeline", "nope"], "invalid choice: 'nope'"),
        (["runconsumer", "--concurrency", "100000"], "argument --concurrency: must be an integer from 1 to 256"),
        (["runconsumer", "--metrics-port", "0"], "CommandError: --metrics-port must be a TCP port (1-65535), got 0."),
        (["queue_health", "--max-lag", str(2**63)], f"CommandError: --max-lag must be at most {2**63 - 1}"),
    ],
)
def test_the_known_bad_arguments_get_one_line(argv: list[str], message: str, scene: Callable) -> None:
    before = scene()
    status, _, err = a.run(*argv)
    refused(status, err)
    assert message in err
    assert scene() == before


def test_a_zero_batch_size_neither_replays_nothing_nor_skips_a_groups_messages(scene: Callable) -> None:
    """Before: "Replayed 0 dead letter(s).", exit 0; "deleted 0 message(s)", exit 0 with every
    group's watermark moved to the head (the unread messages skipped, not purged)."""
    marks = wm("billing", 0), wm("billing", 1)
    for argv in (["queue_dlq", "replay", "--all-matching", "--batch-size", "0", "--yes"],
                 ["queue_topic", "purge", "orders", "--batch-size", "0", "--yes"]):  # fmt: skip
        status, out, err = a.run(*argv)
        refused(status, err)
        assert out == ""
    assert (wm("billing", 0), wm("billing", 1)) == marks
    status, out, _ = a.run("queue_dlq", "list", "--json")
    assert status == 0 and len(__import__("json").loads(out)["items"]) == 4


@pytest.mark.skipif(SPARK_INSTALLED, reason="pyspark is installed")
@pytest.mark.parametrize("pipeline", ["backfill src --topic t", "export --topic t --output o", "report --output r"])
def test_a_spark_pipeline_without_pyspark_says_how_to_install_it(pipeline: str) -> None:
    status, _, err = a.run("queue_pipeline", *pipeline.split())
    refused(status, err)
    assert 'pip install "django-sqlqueue[spark]"' in err


def test_replay_into_a_new_group_asks_first_and_refuses_without_a_terminal(scene: Callable) -> None:
    """Before: ``input()`` on a closed or captured stdin, a traceback."""
    before = scene()
    status, _, err = a.run("queue_pipeline", "replay", "--topic", "orders", "--since", "2026-01-01", "--group", "new")
    refused(status, err)
    assert "refusing without confirmation: pass --yes" in err
    assert scene() == before


#: One bad call per command, run as a real ``manage.py`` process: the exit status and stderr
#: the operator sees.
PROCESS_CASES = {
    "queue_dlq": ["list", "--limit", "-5"],
    "queue_gc": ["--topic", ""],
    "queue_group": ["seek", "billing", "orders", "--to-offset", "-1", "--yes"],
    "queue_health": ["--max-lag", "x"],
    "queue_pipeline": ["replay", "--topic", "orders", "--since", "garbage", "--group", "g"],
    "queue_prune_task_results": ["--older-than", "-1"],
    "queue_status": ["--topic", "\udcff"],
    "queue_topic": ["purge", "orders", "--batch-size", "0", "--yes"],
    "runconsumer": ["--concurrency", "100000"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_from_a_real_command_line_a_bad_argument_exits_2_with_one_line(command: str, scene: Callable) -> None:
    before = scene()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.support.settings", "DATABASE_URL": database_url()}
    argv = [os.fsencode(a) for a in [sys.executable, "manage.py", command, *PROCESS_CASES[command]]]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 2, err
    refused(done.returncode, err)
    assert scene() == before


@pytest.mark.skipif(SPARK_INSTALLED, reason="pyspark is installed")
def test_from_a_real_command_line_a_pipeline_without_pyspark_says_how_to_install_it() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.support.settings", "DATABASE_URL": database_url()}
    argv = [sys.executable, "manage.py", "queue_pipeline", "export", "--topic", "orders", "--output", "/tmp/x"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        (
            "CommandError: queue_pipeline export needs the spark extra (pyspark, pyarrow not installed): "
            'pip install "django-sqlqueue[spark]" (and Java 17 for Spark).'
        )
    ]


@given(st.integers())
def test_a_bounded_integer_takes_exactly_its_range(number: int) -> None:
    parse = _args.bounded_int(1, 10)
    if 1 <= number <= 10:
        assert parse(str(number)) == number
    else:
        with pytest.raises(Exception, match=r"must be an integer from 1 to 10, got '-?\d+"):
            parse(str(number))

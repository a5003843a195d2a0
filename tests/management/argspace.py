"""The argument space of every command, as Hypothesis strategies, and a way to run a command as
``manage.py`` does (tests/management/test_arguments.py).

Each argument has a kind that draws values the command must accept (``valid``) and values it
must refuse at parse time (``invalid``). Values never start with ``-`` unless they are negative
numbers: anything else would be parsed as an option, and an abbreviation such as ``--sett`` is
Django's own ``--settings`` (it would change the environment of the test process).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import re
import string
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.core.management import ManagementUtility
from hypothesis import strategies as st

from django_sqlqueue.management.commands import _args
from django_sqlqueue.rules.timeparse import parse_time

NAME_ALPHABET = string.ascii_letters + string.digits + "._-"
NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")  # what argparse takes for a value, not an option
#: Text an argument can carry: anything but NUL (argv cannot hold it); lone surrogates are the
#: undecodable bytes Python keeps with surrogateescape.
arg_chars = st.characters(exclude_characters="\x00")
UNPRINTABLE = ["\x01", "\x1b[31m", "\n", "\x7f", "\x9b", "\u202e", "\u2066", "\udcff"]
NOT_NUMBERS = ["", " ", "abc", "1.5", "1e3", "0x10", "nan", "inf", "-inf", "9" * 5000, "1,000"]
NOT_SECONDS = ["", " ", "abc", "nan", "inf", "-inf", "-1", "-0.5", "1e300", "0x10", str(_args.MAX_SECONDS + 1)]
NOT_TIMES = ["", "soon", "yesterday", "2026-13-01", "2026-02-30T00:00", "31/01/2026", "0001-01-01T00:00+01:00"]


def safe(value: str) -> str:
    """``value`` as one argument string that argparse takes as a value."""
    return "x" + value if value.startswith("-") and not NEGATIVE.match(value) else value


class Kind:
    def valid(self) -> st.SearchStrategy[str]:
        raise NotImplementedError

    def invalid(self) -> st.SearchStrategy[str]:
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Kind):
    low: int
    high: int

    def valid(self) -> st.SearchStrategy[str]:
        edges = st.sampled_from([self.low, self.high, min(self.low + 1, self.high)])
        return st.one_of(edges, st.integers(self.low, self.high)).map(str)

    def invalid(self) -> st.SearchStrategy[str]:
        outside = st.one_of(
            st.integers(max_value=self.low - 1), st.integers(min_value=self.high + 1), st.just(10**23)
        ).map(str)
        return st.one_of(outside, st.sampled_from(NOT_NUMBERS), st.text(arg_chars).filter(self._refused))

    def _refused(self, value: str) -> bool:
        try:
            return not self.low <= int(value) <= self.high
        except ValueError:
            return True


@dataclass(frozen=True)
class Seconds(Kind):
    def valid(self) -> st.SearchStrategy[str]:
        return st.floats(0, _args.MAX_SECONDS).map(repr)

    def invalid(self) -> st.SearchStrategy[str]:
        return st.one_of(
            st.sampled_from(NOT_SECONDS),
            st.floats(max_value=-0.001).map(repr),
        )


@dataclass(frozen=True)
class Name(Kind):
    max_length: int

    def valid(self) -> st.SearchStrategy[str]:
        given = st.sampled_from(["orders", "typo", "billing", "shipping", "retired", "orders_dlq", "nobody"])
        return st.one_of(given, st.text(NAME_ALPHABET, min_size=1, max_size=self.max_length))

    def invalid(self) -> st.SearchStrategy[str]:
        bad_char = st.text(arg_chars, min_size=1).filter(lambda s: not re.fullmatch(r"[A-Za-z0-9._-]+", s))
        return st.one_of(st.just(""), st.just("x" * (self.max_length + 1)), bad_char, st.sampled_from(UNPRINTABLE))


@dataclass(frozen=True)
class Text(Kind):
    max_length: int = _args.MAX_TEXT_LENGTH

    def valid(self) -> st.SearchStrategy[str]:
        printable = st.characters(exclude_categories=("Cc", "Cs"), exclude_characters="\u202a\u202b\u202c\u202d\u202e")
        return st.text(printable.filter(lambda c: not "\u2066" <= c <= "\u2069"), max_size=40)

    def invalid(self) -> st.SearchStrategy[str]:
        return st.one_of(st.just("y" * (self.max_length + 1)), st.sampled_from(UNPRINTABLE).map(lambda c: f"a{c}b"))


@dataclass(frozen=True)
class Time(Kind):
    def valid(self) -> st.SearchStrategy[str]:
        offsets = st.timedeltas(-dt.timedelta(hours=23, minutes=59), dt.timedelta(hours=23, minutes=59))
        zones = st.none() | offsets.map(lambda d: dt.timezone(dt.timedelta(minutes=d // dt.timedelta(minutes=1))))
        return st.datetimes(timezones=zones).map(lambda t: t.isoformat()).filter(_parses)

    def invalid(self) -> st.SearchStrategy[str]:
        return st.one_of(st.sampled_from(NOT_TIMES), st.text(arg_chars).filter(lambda s: not _parses(s)))


def _parses(value: str) -> bool:
    try:
        parse_time(value)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Choice(Kind):
    choices: tuple[str, ...]

    def valid(self) -> st.SearchStrategy[str]:
        return st.sampled_from(self.choices)

    def invalid(self) -> st.SearchStrategy[str]:
        return st.text(arg_chars).filter(lambda s: s not in self.choices)


@dataclass(frozen=True)
class Partitions(Kind):
    def valid(self) -> st.SearchStrategy[str]:
        return st.lists(st.integers(0, _args.MAX_PARTITIONS - 1), min_size=1, max_size=5).map(
            lambda ns: ",".join(map(str, ns))
        )

    def invalid(self) -> st.SearchStrategy[str]:
        return st.one_of(
            st.sampled_from(["", ",", "a", "-1", "1,,2", str(_args.MAX_PARTITIONS), "0," * 300_000]),
            st.integers(min_value=_args.MAX_PARTITIONS).map(str),
        )


FLAG = None  # an option without a value
TOPIC, GROUP, TEXT, TIME = Name(160), Name(128), Text(), Time()


@dataclass(frozen=True)
class Sub:
    """One subcommand (or a command without subcommands): its arguments and what it may write."""

    positionals: tuple[Kind, ...] = ()
    options: dict[str, Kind | None] = field(default_factory=dict)
    #: Options a valid call always has, and groups of which it has exactly one.
    required: tuple[str, ...] = ()
    one_of: tuple[str, ...] = ()
    #: "no": never writes; "dry-run": writes unless --dry-run; "yes": may write with valid arguments.
    writes: str = "no"


def run(*argv: str) -> tuple[int, str, str]:
    """Run ``manage.py *argv`` in this process; return (exit status, stdout, stderr).

    What ``ManagementUtility.execute()`` does once Django is set up: fetch the command and
    ``run_from_argv`` -- parsing, ``CommandError`` printed as one line and ``sys.exit``.
    Any other exception escapes: that is the traceback the command line would print.
    """
    out, err = io.StringIO(), io.StringIO()
    argv_ = ["manage.py", *argv]
    status = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            ManagementUtility(argv_).fetch_command(argv_[1]).run_from_argv(argv_)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return status, out.getvalue(), err.getvalue()


def snapshot() -> dict[str, list[str]]:
    """Every row of every queue table, as text: what a command wrote shows as a difference."""
    models = [m for m in apps.get_app_config("django_sqlqueue").get_models() if m._meta.managed]
    return {m._meta.db_table: sorted(map(repr, m.objects.values_list())) for m in models}


@st.composite
def valid_argv(draw: Any, space: dict[str | None, Sub]) -> tuple[str | None, list[str]]:
    """A call the parser accepts: a subcommand, its positionals, required and random options."""
    name = draw(st.sampled_from(sorted(space, key=str)))
    sub = space[name]
    argv = [] if name is None else [name]
    argv += [safe(draw(kind.valid())) for kind in sub.positionals]
    chosen = list(sub.required)
    if sub.one_of:
        chosen.append(draw(st.sampled_from(sub.one_of)))
    others = [o for o in sub.options if o not in sub.one_of and o not in ("--yes", "--dry-run")]
    chosen += draw(st.lists(st.sampled_from(others), max_size=4)) if others else []
    for option in chosen:
        kind = sub.options[option]
        argv += [option] if kind is None else [option, safe(draw(kind.valid()))]
    if sub.writes == "dry-run":
        argv.append("--dry-run")
    return name, argv


@st.composite
def invalid_argv(draw: Any, space: dict[str | None, Sub]) -> list[str]:
    """A call with at least one argument the parser must refuse, among otherwise random ones."""
    name, argv = draw(valid_argv(space))
    sub = space[name]
    if "--yes" in sub.options:
        argv.append("--yes")  # nothing may be written even when confirmation is given
    valued = [o for o, kind in sub.options.items() if kind is not None]
    # A bad value first: Hypothesis leans towards the first choices, and values are most of the space.
    bad = draw(st.sampled_from(["value", "positional", "dangling", "missing", "unknown", "subcommand"]))
    if bad == "subcommand" and name is not None:
        return [safe(draw(st.text(arg_chars).filter(lambda s: s not in space))), *argv[1:]]
    if bad == "positional" and sub.positionals:
        at = draw(st.integers(0, len(sub.positionals) - 1))
        argv[1 + at] = safe(draw(sub.positionals[at].invalid()))
        return argv
    if bad == "missing" and sub.positionals:
        return argv[:1] + argv[1 + len(sub.positionals) :]
    if bad == "dangling" and valued:
        return [*argv, draw(st.sampled_from(valued))]
    if bad == "value" and valued:
        option = draw(st.sampled_from(valued))
        kind = sub.options[option]
        assert kind is not None
        at = draw(st.integers(len(sub.positionals) + (name is not None), len(argv)))
        return [*argv[:at], option, safe(draw(kind.invalid())), *argv[at:]]
    unknown = "--bogus-" + draw(st.text(string.ascii_lowercase, max_size=5))
    return [*argv, unknown, *draw(st.lists(st.text(arg_chars).map(safe), max_size=1))]

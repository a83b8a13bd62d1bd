"""What every command's parser shares: the value types of its options (strict whole numbers,
ASCII digits only, no underscores, and positive seconds, with messages that name the value),
the flags that set the library's parameters, and the parser class whose errors are one line."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from shardscope._src.base.comm import CollectiveKind, kind_named, parse_bytes
from shardscope._src.base.errors import ShardscopeError, StrategyError
from shardscope._src.sharding.strategies import get_strategy


def strategy_name(text: str) -> str:
    """A strategy's name (argparse type): a preset or a composition by the naming rule
    (:func:`~shardscope._src.sharding.strategies.get_strategy`'s), refused in its words."""
    try:
        get_strategy(text)
    except StrategyError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def collective_kind(text: str) -> CollectiveKind:
    """A collective kind (argparse type), with dashes or underscores as the library takes it
    (``all-gather``, ``all_gather``), refused in the library's words."""
    try:
        return kind_named(text, what="kind")
    except ShardscopeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _whole(text: str) -> int:
    digits = text.strip().removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if len(digits.lstrip("0")) > 18:  # past any count or size the tool takes, and int64
        raise argparse.ArgumentTypeError(
            f"a {len(digits.lstrip('0'))}-digit number is larger than any value this takes"
        )
    return int(text)


def nonnegative_int(text: str) -> int:
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return value


def positive_int(text: str) -> int:
    value = _whole(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive whole number")
    return value


def positive_number(text: str, unit: str = "") -> float:
    """A finite number above 0 (``450e9``), for bandwidths, sizes and times."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 450e9)") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number{unit}")
    return value


def fraction(text: str) -> float:
    """A share of a whole, above 0 and at most 1 (``0.95``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 0.95)") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} must be a fraction above 0 and at most 1")
    return value


def nonnegative_number(text: str) -> float:
    """A finite number of 0 or more (``1e-6``), for a cost that may be turned off."""
    try:
        zero = float(text) == 0
    except ValueError:
        zero = False  # not a number: positive_number names it
    return 0.0 if zero else positive_number(text, " or 0")


def positive_bytes(text: str) -> float:
    """Bytes above 0: a number (``80e9``) or a size with its unit (``80GB``, ``79.1GiB``)."""
    value = parse_bytes(text)
    if value is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of bytes (e.g. 80e9, 80GB or 79.1GiB)"
        )
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of bytes")
    return value


def positive_float(text: str) -> float:
    """Seconds above 0."""
    return positive_number(text, " of seconds")


def choice_reader(choices: Iterable[str]) -> Any:
    """How an option of ``choices`` reads its value: case-insensitively (``H100`` is
    ``h100``, as a model preset's name is read) where the choices are all lower-case, so no
    two differ by case alone; else as written (None).

    >>> choice_reader(("h100", "tpu-v5p"))("H100"), choice_reader(("Auto", "auto"))
    ('h100', None)
    """
    return str.lower if all(c == c.lower() for c in choices) else None


def add_axis_types_option(p: argparse.ArgumentParser) -> None:
    """``--axis-types explicit|auto``: the axis types of the meshes built for the user's code."""
    p.add_argument(
        "--axis-types",
        choices=("explicit", "auto"),
        type=str.lower,
        default=None,
        help="the mesh axes' type: explicit (JAX's default, sharding in types: out_sharding=, "
        "jax.sharding.reshard) or auto (the compiler propagates shardings; "
        "with_sharding_constraint steers it). Default: what jax.make_mesh gives, explicit",
    )


#: Library parameters whose option keeps its value under another name (its ``dest``); every
#: other parameter is the ``dest`` of the option that sets it, where the command has one.
DEST_OF = {
    "make_step": "program",  # plan --program FILE.py:FUNCTION
    "detect": "distributed",
    "out_dir": "out",
}


@dataclass(frozen=True)
class Flags:
    """The options of the command that ran, by ``dest``, named as argparse names them in its
    own errors (``--mesh``, ``-n/--num-processes``): what a library error's parameters are
    called on this command line. A parameter this command has no option for is left out."""

    options: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, parser: argparse.ArgumentParser) -> Flags:
        """The options ``parser`` itself takes (not those of its sub-commands)."""
        actions = parser._actions  # every option, those of argument groups included
        return cls({a.dest: "/".join(a.option_strings) for a in actions if a.option_strings})

    def flag(self, param: str) -> str | None:
        """The option that sets the library parameter ``param``, or None."""
        return self.options.get(DEST_OF.get(param, param))

    def __call__(self, params: Sequence[str]) -> str:
        """`` (flags --d-model, --ff)``: the flags that set the parameters an error names."""
        flags = list(dict.fromkeys(f for f in map(self.flag, params) if f is not None))
        if not flags:
            return ""
        return f" ({'flag' if len(flags) == 1 else 'flags'} {', '.join(flags)})"


#: For text shown before a command is known.
NO_FLAGS = Flags()


PROG = "shardscope"


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A sub-command's defaults overwrite its parent's: after parsing, ``command_parser`` is
        # the parser of the sub-command that runs, whose options name the library's parameters.
        self.set_defaults(command_parser=self)

    def error(self, message: str) -> NoReturn:
        names = re.fullmatch(r"argument ([\w/-]+): expected one argument", message)
        if names:
            # argparse reads a value that starts with '-' (--memory -5GB) as the next flag
            flag = max(names.group(1).split("/"), key=len)
            message += f"; give it a value (one that starts with '-' written {flag}=VALUE)"
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")

    # argparse converts every option value here, whatever group or parser added the option:
    # the one place where an empty value (--mesh '') is refused for every flag at once.
    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        if action.option_strings and not arg_string.strip():
            raise argparse.ArgumentError(action, "is empty; give it a value")
        return super()._get_value(action, arg_string)

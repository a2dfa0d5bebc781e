"""A dataclass as a command line: the one mechanism behind the project's generated options.

Each field is an option `--kebab-case-name` with its `help` metadata as help text and its
`choices` metadata as choices; the annotation gives the type (`int`, `float`, `str`, `bool`,
`X | None`). A field whose metadata has `"spec": True` holds a nested dataclass (an algorithm
section): its fields become `--<section>-<field>` options in a group of their own. The
parser's errors are one line on stderr with where to read the options, exit status 2.

It lives here because the CHAIR service stands alone (it imports nothing from entropyrl) and
entropyrl's commands may import it: `python -m chair_server`, `entropyrl demo`, the acceptance
run and the study all build their command lines with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

_TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


class OneLineParser(argparse.ArgumentParser):
    """A usage error as one line on stderr with where to read the options, exit status 2
    (argparse's default prints the whole usage block first, burying the line)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} ({self.prog} --help lists the options)", file=sys.stderr)
        raise SystemExit(2)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _kind(f: dataclasses.Field) -> str:
    """The field's type name without `| None`: "int", "float", "str", "bool" or another."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return kind.replace(" | None", "").replace("<class '", "").replace("'>", "").strip()


def add_field(
    target: Any,
    f: dataclasses.Field,
    *,
    option: str,
    dest: str,
    default: Any,
    show_default: bool,
    negatable: bool,
) -> None:
    """One option for field `f` on `target` (a parser or a group)."""
    text = f.metadata.get("help", "").replace("%", "%%")  # argparse %-formats help texts
    if show_default and "(default:" not in text:
        # argparse fills it in: a verb's own set_defaults (study, acceptance) shows, not cls()'s
        text = f"{text} (default: %(default)s)"
    if _kind(f) == "bool":
        action = argparse.BooleanOptionalAction if negatable else "store_true"
        target.add_argument(option, dest=dest, action=action, default=default, help=text)
        return
    choices = f.metadata.get("choices")
    target.add_argument(
        option,
        dest=dest,
        type=_TYPES.get(_kind(f), str),
        default=default,
        choices=choices,
        metavar=None if choices else f.name.upper(),
        help=text,
    )


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    show_default: bool = True,
    negatable: bool = True,
    exclusive: Sequence[str] = (),
) -> None:
    """One option per field of dataclass `cls` (its defaults from `cls()`), sections as groups.

    `show_default` appends "(default: X)" to each help text; `negatable` gives a bool both
    `--x` and `--no-x` (else `--x` only, a switch off by default); the fields named in
    `exclusive` form a required group of which exactly one is given.
    """
    defaults = cls()
    one_of = parser.add_mutually_exclusive_group(required=True) if exclusive else None
    for f in dataclasses.fields(cls):
        common = {"show_default": show_default, "negatable": negatable}
        if f.metadata.get("spec"):
            group = parser.add_argument_group(f"{f.name} ({f.metadata.get('help', '')})")
            spec = getattr(defaults, f.name)
            for sub in dataclasses.fields(spec):
                option, dest = flag(f"{f.name}_{sub.name}"), f"{f.name}__{sub.name}"
                add_field(
                    group, sub, option=option, dest=dest, default=getattr(spec, sub.name), **common
                )
            continue
        target = one_of if f.name in exclusive else parser
        default = getattr(defaults, f.name)
        add_field(target, f, option=flag(f.name), dest=f.name, default=default, **common)


def from_args(args: argparse.Namespace | dict[str, Any], cls: type) -> Any:
    """`cls` built from parsed options (entries that are not fields are ignored); a section is
    passed as the mapping of its options."""
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("spec"):
            prefix = f"{f.name}__"
            section = {k[len(prefix) :]: v for k, v in given.items() if k.startswith(prefix)}
            if section:
                values[f.name] = section
        elif f.name in given:
            values[f.name] = given[f.name]
    return cls(**values)


def to_command_line(value: Any, *, leave_out: Sequence[str] = ()) -> list[str]:
    """The options that give dataclass `value` back (fields at their default left out)."""
    words: list[str] = []
    for f in dataclasses.fields(value):
        current = getattr(value, f.name)
        if f.name in leave_out or current == f.default:
            continue
        words += [flag(f.name)] if current is True else [flag(f.name), str(current)]
    return words

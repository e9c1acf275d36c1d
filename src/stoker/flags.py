"""Settings that are also command-line flags, declared once, as dataclass fields: every CLI's helper.

A command's settings are a keyword-only dataclass; each field that is a flag is made with
:func:`option`: its default, its help and the rest of its :class:`Flag` (the ``--help`` group,
the allowed values and range, what the default means, ...). Its type is the field's annotation
(``int | None``, ``tuple[int, ...]``, ``list[str] | None``). From these declarations
:func:`add_flags` builds the parser, :func:`check_value` checks a value (one message naming the
flag and what it allows), :func:`format_value` writes one as a command line would, and
:func:`given_values` reads a parsed namespace back into the dataclass's keywords.

``stoker bench`` (tf_cnn_benchmarks' flags), the recipes (``stoker train NAME``), ``stoker
evaluate`` and ``stoker serve`` declare their flags here. Two command-line styles, as each
command's users expect them:

- ``"absl"`` (``stoker bench``): absl's booleans ``--flag``, ``--noflag``, ``--flag=true``;
  lists comma-separated; a flag not given is absent from the namespace, so the dataclass holds
  the defaults and a flag given where it does not apply can be refused;
- ``"argparse"`` (the others): argparse's own: a boolean is ``--flag`` (and ``--no-flag`` where
  it defaults to true), a list takes several values after its flag, the defaults are in the
  namespace (and in ``--help`` with :class:`DefaultsHelpFormatter`).

A bad value is a :class:`~stoker.errors.FlagError` (a ``ConfigError`` naming the flags; a
command exits 2 with it).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .errors import FlagError

Style = Literal["absl", "argparse"]

#: Kinds of flag: bool, int, float, str, list (of ``item``: comma-separated in the absl style,
#: several values in the argparse style) and compile (a bool or a mode: ``--compile=step``).
FLAG_KINDS: tuple[str, ...] = ("bool", "int", "float", "str", "list", "compile")
_KIND_OF_ANNOTATION = {
    "bool": ("bool", "str"),
    "int": ("int", "str"),
    "int | None": ("int", "str"),
    "float": ("float", "str"),
    "float | None": ("float", "str"),
    "str": ("str", "str"),
    "str | None": ("str", "str"),
    "bool | str": ("compile", "str"),
    "tuple[int, ...]": ("list", "int"),
    "tuple[float, ...]": ("list", "float"),
    "list[str] | None": ("list", "str"),
}


@dataclass(frozen=True, kw_only=True)
class Flag:
    """One flag: what ``--help`` says and how a value is parsed and checked.

    ``default_text`` says what the default means where the value alone does not (``0``: the
    model's batch size); in the absl style a flag whose default is ``None`` must have one.
    ``minimum`` / ``above`` / ``maximum`` bound a number (``minimum`` of an ``int`` flag: an
    integer >= it); on a list they bound every item. ``case`` normalises a string on the command
    line (``upper``: ``nhwc`` is ``NHWC``). ``note`` is set only on the rows of flags accepted
    without an effect (``stoker bench``'s noted flags). ``nargs``, ``metavar`` and ``required``
    are argparse's, for the argparse style (``nargs="+"``: one or more values)."""

    name: str = ""
    kind: str = ""
    default: Any = None
    help: str
    group: str = ""
    default_text: str | None = None
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    item: str = "str"
    case: str | None = None
    #: more for a docs page's flag list (Markdown), after the help
    docs: str = ""
    note: str | None = None
    nargs: str | None = None
    metavar: str | None = None
    required: bool = False

    @property
    def implemented(self) -> bool:
        """A field gives it its meaning (not a noted row)."""
        return self.note is None

    def help_text(self) -> str:
        """The absl style's ``--help`` line: the help, then the default (stated once) or the note."""
        if self.note is not None:
            return f"{self.help}: {self.note}"
        return f"{self.help}; default: {self.default_text or format_value(self.default)}"


def option(default: Any, help: str, **meta: Any) -> Any:
    """A settings field that is a flag: ``--NAME`` with this ``default`` and ``help``; ``meta``
    holds :class:`Flag`'s other settings (``group``, ``choices``, ``minimum``, ``nargs``, ...)."""
    return dataclasses.field(default=default, metadata={"flag": Flag(help=help, **meta)})


def field_flags(config_class: type) -> tuple[Flag, ...]:
    """The flags of ``config_class``'s fields (those made with :func:`option`), named and typed."""
    found = _FIELD_FLAGS.get(config_class)
    if found is None:
        flags = []
        for f in dataclasses.fields(config_class):
            spec = f.metadata.get("flag")
            if spec is not None:
                kind, item = _KIND_OF_ANNOTATION[str(f.type)]
                flags.append(dataclasses.replace(spec, name=f.name, kind=kind, item=item, default=f.default))
        found = _FIELD_FLAGS[config_class] = tuple(flags)
    return found


_FIELD_FLAGS: dict[type, tuple[Flag, ...]] = {}  # per class: its fields do not change


def given_values(config_class: type, args: argparse.Namespace) -> dict[str, Any]:
    """The keywords of ``config_class`` that ``args`` holds (in the absl style, only the flags given)."""
    given = vars(args)
    return {f.name: given[f.name] for f in dataclasses.fields(config_class) if f.name in given}


def format_value(value: Any) -> str:
    """A flag value as it is written on a command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def fail(message: str, *flags: str) -> FlagError:
    """A :class:`~stoker.errors.FlagError` naming ``flags`` (to ``raise``)."""
    return FlagError(tuple(flags), message)


def check_value(flag: Flag, value: Any) -> None:
    """Raise :class:`~stoker.errors.FlagError` naming ``--flag`` when ``value`` is not allowed (a
    choice, an integer, a range); ``None`` passes where the default is ``None``."""
    name = flag.name
    if value is None and flag.default is None:
        return
    if flag.choices is not None and value not in flag.choices:
        allowed = ", ".join(format_value(c) for c in flag.choices)
        raise fail(f"--{name}={value!r} is not allowed; allowed values: {allowed}", name)
    if flag.kind == "list":
        for item in value:
            _check_number(flag, item, f"--{name}: every value")
    elif flag.kind in ("int", "float"):
        _check_number(flag, value, f"--{name}")


def check_values(settings: Any) -> None:
    """:func:`check_value` for every flag of the dataclass instance ``settings``."""
    for flag in field_flags(type(settings)):
        check_value(flag, getattr(settings, flag.name))


def _number(value: float) -> str:
    return f"{value:g}"


def _check_number(flag: Flag, value: Any, what: str) -> None:
    low, minimum, high = flag.above, flag.minimum, flag.maximum
    if flag.item == "str" and flag.kind == "list":
        return
    if minimum is not None and (flag.kind == "int" or flag.item == "int"):
        integer = isinstance(value, int) and not isinstance(value, bool)
        if not integer or value < minimum or (high is not None and value > high):
            bound = f">= {_number(minimum)}" if high is None else f"in [{_number(minimum)}, {_number(high)}]"
            raise fail(f"{what} must be an integer {bound}; got {value!r}", flag.name)
    elif high is not None:
        bound = f"({_number(low)}" if low is not None else f"[{_number(minimum or 0)}"
        if not ((value > low) if low is not None else (value >= (minimum or 0))) or not value <= high:
            raise fail(f"{what} must be in {bound}, {_number(high)}]; got {value}", flag.name)
    elif low is not None and not value > low:
        raise fail(f"{what} must be > {_number(low)}; got {value}", flag.name)
    elif minimum is not None and value < minimum:
        raise fail(f"{what} must be >= {_number(minimum)}; got {value}", flag.name)


# ------------------------------------------------------------------------------ the command line
_TRUE = ("1", "true", "t", "yes", "y")
_FALSE = ("0", "false", "f", "no", "n")


def parse_bool(text: str) -> bool:
    """absl's boolean values: true/false, t/f, yes/no, y/n, 1/0 (any case)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_compile(text: str) -> bool | str:
    value = text.strip().lower()
    if value in ("module", "step", "none"):
        return value
    try:
        return parse_bool(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected true, false, module or step, got {text!r}") from None


def _list_parser(item: str) -> Callable[[str], tuple[Any, ...]]:
    convert: Callable[[str], Any] = {"int": int, "float": float, "str": str}[item]

    def parse(text: str) -> tuple[Any, ...]:
        try:
            return tuple(convert(v.strip()) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {item}s, got {text!r}") from None

    return parse


def _parser_of(flag: Flag) -> Callable[[str], Any]:
    if flag.kind == "list":
        return _list_parser(flag.item)
    if flag.case is not None:
        return str.upper if flag.case == "upper" else str.lower
    parsers: dict[str, Callable[[str], Any]] = {
        "bool": parse_bool,
        "compile": _parse_compile,
        "int": int,
        "float": float,
        "str": str,
    }
    return parsers[flag.kind]


def add_flags(
    parser: argparse.ArgumentParser, flags: Sequence[Flag], *, style: Style, groups: Sequence[str] = ()
) -> None:
    """Add ``flags`` to ``parser`` in ``style`` (see the module docstring); a flag's ``group``
    is one of ``groups`` (``--help`` lists them in that order), or empty: the parser's own."""
    sections = {name: parser.add_argument_group(name) for name in groups}
    for flag in flags:
        where: Any = sections[flag.group] if flag.group else parser
        if style == "absl":
            _add_absl(parser, where, flag)
        else:
            _add_argparse(where, flag)


def _add_absl(parser: argparse.ArgumentParser, where: Any, flag: Flag) -> None:
    """No argparse default (a flag not given is absent); booleans get absl's ``--noNAME``."""
    help = flag.help_text().replace("%", "%%")  # argparse formats help with %
    kw: dict[str, Any] = {"type": _parser_of(flag), "help": help, "default": argparse.SUPPRESS}
    if flag.kind in ("bool", "compile"):
        kw.update(nargs="?", const=True, metavar="BOOL" if flag.kind == "bool" else "MODE")
    if flag.choices is not None:  # checked with the field (one message, naming the allowed values)
        kw["metavar"] = "{" + ",".join(format_value(c) for c in flag.choices) + "}"
    where.add_argument(f"--{flag.name}", **kw)
    if flag.kind in ("bool", "compile"):
        parser.add_argument(
            f"--no{flag.name}",
            dest=flag.name,
            action="store_const",
            const=False,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )


def _add_argparse(where: Any, flag: Flag) -> None:
    """argparse's defaults and booleans (``--flag``; ``--flag`` / ``--no-flag`` where the default
    is true); the help as written."""
    kw: dict[str, Any] = {"default": flag.default, "help": flag.help}
    if flag.required:
        kw["required"] = True
    if flag.kind == "bool":
        kw["action"] = argparse.BooleanOptionalAction if flag.default else "store_true"
    elif flag.kind == "list":
        kw.update(nargs=flag.nargs or "+", type={"int": int, "float": float}.get(flag.item, str))
    elif flag.kind != "str" or flag.default is not None:
        kw["type"] = _parser_of(flag)
    for key in ("choices", "nargs", "metavar"):
        if getattr(flag, key) is not None:
            kw[key] = getattr(flag, key)
    where.add_argument(f"--{flag.name}", **kw)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """The argparse style's ``--help``: each flag's default, as ``ArgumentDefaultsHelpFormatter``,
    but only where it says something: not after a help text that states its own default, not for
    ``None``."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help = action.help or ""
        if "default" in help or action.default in (None, argparse.SUPPRESS) or not action.option_strings:
            return help
        return f"{help} (default: %(default)s)"


__all__ = [
    "FLAG_KINDS",
    "DefaultsHelpFormatter",
    "Flag",
    "Style",
    "add_flags",
    "check_value",
    "check_values",
    "fail",
    "field_flags",
    "format_value",
    "given_values",
    "option",
    "parse_bool",
]

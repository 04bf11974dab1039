"""Settings declared once: a config dataclass's `option()` fields carry their flag's help and choices, and the command
line of every command that sets them, the argv a parent passes to its children and the settings a service reports
are all derived from those fields, in the flag's own vocabulary."""
import argparse
import types
from dataclasses import MISSING, Field, field, fields


def option(default=MISSING, help: str = "", choices: tuple | None = None, flag: str | None = None,
           short: str | None = None):
    """A config field that is also a command-line flag: --field-name (or `flag`; a bool field whose default is True
    gets a flag that turns it off, named by `flag`), with `short` as a second name."""
    return field(default=default, metadata={"help": help, "choices": choices, "flag": flag, "short": short})


def option_fields(config_type) -> list[Field]:
    return [f for f in fields(config_type) if "help" in f.metadata]


def flag_of(option_field: Field) -> str:
    return option_field.metadata["flag"] or "--" + option_field.name.replace("_", "-")


def add_options(parser: argparse.ArgumentParser, config_type, skip: tuple[str, ...] = ()) -> None:
    """The flags of config_type's option fields, but those named in skip (which the command places itself)."""
    for option_field in option_fields(config_type):
        if option_field.name in skip:
            continue
        names = [flag_of(option_field), *filter(None, [option_field.metadata["short"]])]
        default = None if option_field.default is MISSING else option_field.default
        described = dict(dest=option_field.name, help=_help(option_field, default))
        if option_field.type is bool:
            parser.add_argument(*names, action="store_false" if default else "store_true", **described)
        else:
            parser.add_argument(*names, type=_value_type(option_field), default=default,
                                choices=option_field.metadata["choices"], **described)


def option_values(args: argparse.Namespace, config_type, skip: tuple[str, ...] = ()) -> dict:
    """config_type's option fields as args holds them (the keyword arguments of config_type, less those in skip)."""
    return {f.name: getattr(args, f.name) for f in option_fields(config_type) if f.name not in skip}


def as_flags(values, config_type, skip: tuple[str, ...] = ()) -> list[str]:
    """The flags that set config_type's option fields to values (a config, a namespace of parsed flags or a dict):
    each non-bool field that is set, each bool field that differs from its default."""
    get = values.get if isinstance(values, dict) else lambda name: getattr(values, name)
    flags = []
    for option_field in option_fields(config_type):
        value = get(option_field.name)
        if option_field.name in skip or value is None:
            continue
        if option_field.type is bool:
            flags += [flag_of(option_field)] if value != option_field.default else []
        else:
            flags += [flag_of(option_field), str(value)]
    return flags


def _value_type(option_field: Field):
    kind = option_field.type
    if isinstance(kind, types.UnionType):  # `int | None`: an optional flag of that type
        kind = next(arg for arg in kind.__args__ if arg is not type(None))
    return kind


def _help(option_field: Field, default) -> str:
    text = option_field.metadata["help"]
    if option_field.type is bool or default in (None, ""):
        return text
    return f"{text} (default: {default})" if text else f"default: {default}"

"""The declared structure of a sweep spec file (the format: `distill.experiments.run.spec`).

`SpecFields` (the top-level keys), `StageFields` (an entry of `stages:`) and `SlurmFields` (the
`slurm:` section) are dataclasses; `parse_fields` checks a mapping read from YAML against one of
them: unknown and missing keys first, then the type of every field, which jsonargparse checks
against the annotations (`Name`, `NotEmptyStr`, `PositiveInt`, `Literal[...]`, unions, lists),
then the nested dataclasses under their own labels (`slurm`, `stages[0]`). Every error is a
`SpecError` naming the field, the value and what it must be (each field's `must` text), instead of
jsonargparse's own report. What depends on more than a field's type (axis values, stage order,
non-empty lists) is checked by `distill.experiments.run.spec` and `distill.experiments.run.axes`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from jsonargparse import ArgumentError, ArgumentParser
from jsonargparse.typing import NotEmptyStr, PositiveInt, restricted_string_type

REFERENCE_KINDS = ("start", "teacher")
NAME_PATTERN = "[A-Za-z0-9_.-]+"
Name = restricted_string_type("Name", f"^{NAME_PATTERN}$", docstring="a spec or stage name")
Paths = NotEmptyStr | list[NotEmptyStr]  # one config file, or a list (later ones override earlier)
Option = NotEmptyStr | int | float  # the value of an sbatch option

T = TypeVar("T")


class SpecError(ValueError):
    """A sweep spec that cannot be run; the message names the field, the value and what is allowed."""


def _field(must: str, **default: Any) -> Any:
    """A schema field; `must` completes "'<field>' must ..." in the errors about it."""
    return field(metadata={"must": must}, **default)


NAME = f"match {NAME_PATTERN}"
PATHS = "be a config path or a non-empty list of paths (the fit configs its runs start from)"
OVERRIDES = "be a mapping of dotted config path -> value"
AXES = "be a non-empty mapping of axis -> list of values"
OPTION = "be a string or number"
LINES = "be a list of strings"


@dataclass
class SlurmFields:
    """`slurm:`: defaults of `distill sweep --emit-slurm` (`distill.experiments.run.slurm`)."""

    partition: Option | None = _field(OPTION, default=None)
    account: Option | None = _field(OPTION, default=None)
    gpus: Option | None = _field(OPTION, default=None)
    cpus_per_task: Option | None = _field(OPTION, default=None)
    mem: Option | None = _field(OPTION, default=None)
    time: Option | None = _field(OPTION, default=None)
    # SIGTERM to the task's sweep runner 2 minutes before the time limit: it passes it to its fit,
    # which stops at its next step with a checkpoint (distill.stopping); the requeued or next
    # task resumes it.
    signal: Option | None = _field(OPTION, default="B:TERM@120")
    max_parallel: PositiveInt | None = _field("be a positive integer", default=None)
    extra: list[str] = _field(LINES, default_factory=list)
    setup: list[str] = _field(LINES, default_factory=list)


@dataclass
class StageFields:
    """An entry of `stages:`."""

    name: Name = _field(NAME)
    base: Paths = _field(PATHS)
    overrides: dict | None = _field(OVERRIDES, default=None)
    axes: dict | None = _field(AXES, default=None)
    after: str | None = _field("name an earlier stage", default=None)


@dataclass
class SpecFields:
    """A spec file's top level; with `stages`, `base`, `overrides` and `axes` are the stages'."""

    name: Name = _field(NAME)
    base: Paths | None = _field(PATHS, default=None)
    out: NotEmptyStr | None = _field("be a directory", default=None)
    overrides: dict | None = _field(OVERRIDES, default=None)
    axes: dict | None = _field(AXES, default=None)
    slurm: SlurmFields | None = _field("be a mapping of sbatch options", default=None)
    stages: list[StageFields] = _field("be a non-empty list of stage mappings", default_factory=list)
    references: bool | list[Literal[REFERENCE_KINDS]] = _field(
        f"be true, false or a list of distinct names from {', '.join(REFERENCE_KINDS)} (e.g. [start])",
        default=True,
    )
    claims: NotEmptyStr | None = _field(
        "be the path of a claims file, relative to the repository root", default=None
    )


def label_of(label: str, name: str) -> str:
    """The dotted label of a field: `slurm.time`, `stages[0].base`, or the name at the top."""
    return f"{label}.{name}" if label else name


def field_error(cls: type, name: str, value: Any, label: str = "") -> SpecError:
    """The error about a field: "'<label>' must <its `must` text>, got <value>"."""
    must = next(f.metadata["must"] for f in dataclasses.fields(cls) if f.name == name)
    return SpecError(f"{label_of(label, name)!r} must {must}, got {value!r}")


def _nested(hint: Any) -> tuple[type | None, bool]:
    """(the dataclass a field holds, whether as a list) for `X`, `X | None`, `list[X]`; else (None, False)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) else []
    if typing.get_origin(hint) in (typing.Union, type(int | None)) and len(args) == 1:
        hint = args[0]
    if typing.get_origin(hint) is list and dataclasses.is_dataclass(typing.get_args(hint)[0]):
        return typing.get_args(hint)[0], True
    return (hint, False) if dataclasses.is_dataclass(hint) else (None, False)


def _admits_none(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


@functools.cache
def _parser(cls: type) -> ArgumentParser:
    """A parser of the fields of `cls` that hold no dataclass (those are parsed on their own)."""
    parser = ArgumentParser(exit_on_error=False, default_env=False)
    nested = {name for name, hint in typing.get_type_hints(cls).items() if _nested(hint)[0]}
    parser.add_class_arguments(cls, skip=nested)
    return parser


def _plain(value: Any) -> Any:
    """jsonargparse's restricted types (`Name`, `NotEmptyStr`, `PositiveInt`) as plain `str`/`int`,
    also in lists, so that no subclass reaches a YAML dump (which would tag it `!!python/object`)."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return [_plain(v) for v in value] if isinstance(value, list) else value


def _check_keys(cls: type, data: Any, label: str) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(data, dict):
        raise SpecError(
            f"{repr(label) if label else 'a sweep spec'} must be a mapping with keys {', '.join(names)}, got {data!r}"
        )
    unknown = sorted(map(str, set(data) - set(names)))
    if unknown:
        where = f"{label}: unknown key(s)" if label else "unknown spec key(s)"
        raise SpecError(f"{where} {', '.join(unknown)}; allowed: {', '.join(names)}")
    for f in dataclasses.fields(cls):
        if (
            f.name not in data
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ):
            raise SpecError(f"{label_of(label, f.name)!r} is required: it must {f.metadata['must']}")


def _parse_flat(cls: type, data: dict[str, Any], label: str) -> dict[str, Any]:
    """The fields of `data` that hold no dataclass, checked by jsonargparse against `cls`."""
    try:
        parsed = _parser(cls).parse_object(data)
    except ArgumentError as err:
        key = re.match(r'Parser key "(\w+)"', str(err))
        if key is None or key[1] not in data:  # not about one field: jsonargparse's first line
            raise SpecError(f"{label or 'spec'}: {str(err).splitlines()[0]}") from None
        raise field_error(cls, key[1], data[key[1]], label) from None
    values = {}
    for name, raw in data.items():
        value = _plain(parsed[name])
        # jsonargparse reads a string as YAML ('true', 'null', '[a]'); in a spec a quoted string is a string
        if isinstance(raw, str) and not isinstance(value, str):
            raise field_error(cls, name, raw, label)
        values[name] = value
    return values


def parse_fields(cls: type[T], data: Any, label: str = "") -> T:
    """`data` (a mapping read from YAML) as an instance of the schema dataclass `cls`; fields not
    in `data` keep their defaults. `label` is where `data` sits in the spec (`slurm`, `stages[0]`;
    empty at the top). Raises SpecError."""
    _check_keys(cls, data, label)
    hints = typing.get_type_hints(cls)
    for name, raw in data.items():  # jsonargparse takes None for "not given"
        if raw is None and not _admits_none(hints[name]):
            raise field_error(cls, name, raw, label)
    values = _parse_flat(cls, {k: v for k, v in data.items() if not _nested(hints[k])[0]}, label)
    for name, raw in data.items():
        inner, many = _nested(hints[name])
        if inner is None or raw is None:
            values.setdefault(name, raw)
        elif not many:
            values[name] = parse_fields(inner, raw, label_of(label, name))
        elif not isinstance(raw, list):
            raise field_error(cls, name, raw, label)
        else:
            values[name] = [
                parse_fields(inner, item, f"{label_of(label, name)}[{i}]") for i, item in enumerate(raw)
            ]
    return cls(**values)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last)."""


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    keys = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in keys:
            raise SpecError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
        keys.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
# YAML 1.1 reads `1e-4` (no dot) as a string; learning rates are written that way, so read it as a float.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def read_spec_file(path: Path) -> Any:
    """The data of a spec file: YAML, with duplicate keys refused and `1e-4` read as a float."""
    if not path.is_file():
        raise SpecError(f"sweep spec {str(path)!r} does not exist")
    try:
        return yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        raise SpecError(f"sweep spec {str(path)!r} is not valid YAML: {err}") from err

"""Config files that start from others: a top-level `base:` include, expanded into LightningCLI
`--config` arguments (used by `distill fit`/`test` and the sweep references)."""

from __future__ import annotations

from pathlib import Path

import yaml


def expand_bases(args: list[str]) -> list[str]:
    """Config files may start from others: a top-level `base: FILE` (or a list; relative to the
    file) is replaced by `--config FILE ... --config <the rest>`, so that LightningCLI deep-merges
    them (jsonargparse's own nested `config:` key replaces a model's `init_args` wholesale)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-c", "--config") and i + 1 < len(args):
            out += _expand_file(args[i + 1], seen=())
            i += 2
            continue
        if arg.startswith("--config="):
            out += _expand_file(arg.split("=", 1)[1], seen=())
        else:
            out.append(arg)
        i += 1
    return out


def _expand_file(path: str, seen: tuple) -> list[str]:
    file = Path(path)
    if not file.is_file():
        return ["--config", path]  # not a file (or an inline YAML string): jsonargparse reports it
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"config {path} is not valid YAML: {yaml_line(err)}") from None
    if not isinstance(data, dict) or "base" not in data:
        return ["--config", path]
    if file.resolve() in seen:
        raise ValueError(f"config {path}: `base` includes form a cycle: {' -> '.join(map(str, seen))}")
    bases = data.pop("base")
    out: list[str] = []
    for base in [bases] if isinstance(bases, str) else bases:
        base_path = file.parent / base
        if not base_path.is_file():
            raise FileNotFoundError(f"config {path}: base {base!r} not found (looked for {base_path})")
        out += _expand_file(str(base_path), (*seen, file.resolve()))
    return out + ["--config", yaml.safe_dump(data)] if data else out


def merged_config(path: str | Path) -> dict:
    """A config file as one mapping, its `base:` files merged in as LightningCLI merges them
    (mappings deep-merged, later wins; a `key+` list appended to `key`): for reading a config's
    settings outside a run (the memory tables, the GPU smoke test)."""
    file = Path(path)
    data = yaml.safe_load(file.read_text())
    bases = data.pop("base", [])
    merged: dict = {}
    for base in [bases] if isinstance(bases, str) else bases:
        _merge(merged, merged_config(file.parent / base))
    return _merge(merged, data)


def _merge(into: dict, new: dict) -> dict:
    for key, value in new.items():
        if key.endswith("+"):
            into[key[:-1]] = into.get(key[:-1], []) + value
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def yaml_line(err: yaml.YAMLError) -> str:
    """'line L, column C: problem' from a PyYAML error."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return problem if mark is None else f"line {mark.line + 1}, column {mark.column + 1}: {problem}"

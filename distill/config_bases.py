"""Config files that start from others: a top-level `base:` include, expanded into LightningCLI
`--config` arguments (used by `distill fit`/`test` and the sweep references).

Settings that moved into a group (`MOVED`: `model.compile_decoding` is now
`model.execution.compile_decoding`, `data.eval_batch_size` is `data.evaluation.batch_size`, ...)
are still read under their old names, from config files and flags alike, with one line on stderr
naming the new place: an archived run's config and overrides run as they did."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

# (section, old name) -> the setting's place in its section now.
MOVED: dict[tuple[str, str], str] = {
    **{
        ("model", name): f"execution.{name}"
        for name in (
            "lean_logits",
            "eval_logit_budget_mb",
            "gradient_checkpointing",
            "attn_implementation",
            "compile_decoding",
            "compile_forwards",
        )
    },
    ("model", "log_text_every"): "text_log.every",
    ("model", "num_text_samples"): "text_log.samples",
    **{
        ("model", name): f"objective.{name}"
        for name in (
            "num_iterations",
            "clip_epsilon",
            "clip_epsilon_high",
            "kl_coef",
            "kl_estimator",
            "scale_rewards",
            "advantage_epsilon",
        )
    },
    **{
        ("data", name): f"sampling.{name}"
        for name in ("max_new_tokens", "temperature", "top_k", "top_p", "speculative_top_k")
    },
    **{
        ("data", name): f"prompts.{name}"
        for name in ("tokenizer", "chat_template", "chat_template_kwargs", "teacher_context", "student_context")
    },
    **{("data", name): f"evaluation.{name}" for name in ("val_tasks", "test_tasks", "val_size", "test_size")},
    ("data", "eval_batch_size"): "evaluation.batch_size",
    ("data", "eval_max_new_tokens"): "evaluation.max_new_tokens",
}


def _told(where: str, moves: list[tuple[str, str]]) -> None:
    """One line on stderr naming each moved setting's new place."""
    if moves:
        names = ", ".join(f"{old} is now {new}" for old, new in moves)
        print(f"distill: {where}: settings moved ({names}); read at their new places", file=sys.stderr)


def moved_key(key: str, quiet: bool = False) -> str:
    """A dotted config key (`data.eval_batch_size`, `model.init_args.compile_decoding`, ...) at its
    current place: a moved setting's new key, any other key unchanged."""
    parts = key.split(".")
    inner = 2 if len(parts) > 2 and parts[0] == "model" and parts[1] == "init_args" else 1
    if len(parts) <= inner or (parts[0], parts[inner]) not in MOVED:
        return key
    new = ".".join([*parts[:inner], *MOVED[parts[0], parts[inner]].split("."), *parts[inner + 1 :]])
    if not quiet:
        _told("flag", [(key, new)])
    return new


def moved_args(args: list[str]) -> list[str]:
    """Command-line flags with each moved setting's flag (`--data.eval_batch_size 8`,
    `--model.init_args.compile_decoding=false`) at its new place; `--config` values untouched."""
    out = []
    for arg in args:
        if arg.startswith("--") and not arg.startswith("--config"):
            name, eq, value = arg[2:].partition("=")
            arg = f"--{moved_key(name)}{eq}{value}"
        out.append(arg)
    return out


def moved_config(config: Any) -> tuple[Any, list[tuple[str, str]]]:
    """A config mapping with each moved setting at its new place (under `model`, `model.init_args`
    and `data`), and the (old, new) dotted keys of those that moved. Where both spellings are
    present the new one wins."""
    if not isinstance(config, dict):
        return config, []
    out, moved = dict(config), []
    blocks = [("data", out)]
    if isinstance(out.get("model"), dict):
        out["model"] = dict(out["model"])
        blocks.append(("model", out))
        if isinstance(out["model"].get("init_args"), dict):
            out["model"]["init_args"] = dict(out["model"]["init_args"])
    for section, parent in blocks:
        targets = [(section, parent.get(section))]
        if section == "model" and isinstance(parent["model"], dict):
            targets.append(("model.init_args", parent["model"].get("init_args")))
        for where, block in targets:
            if not isinstance(block, dict):
                continue
            if where == "data":
                block = out["data"] = dict(block)
            for name in [n for n in block if (section, n) in MOVED]:
                group, _, field = MOVED[section, name].partition(".")
                value = block.pop(name)
                existing = block.get(group)
                group_block = block[group] = dict(existing) if isinstance(existing, dict) else {}
                group_block.setdefault(field, value)
                moved.append((f"{where}.{name}", f"{where}.{group}.{field}"))
    return out, moved


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
    data, moved = moved_config(data)
    _told(f"config {path}", moved)
    if not isinstance(data, dict) or ("base" not in data and not moved):
        return ["--config", path]
    if "base" not in data:
        return ["--config", yaml.safe_dump(data)]
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
    data = moved_config(yaml.safe_load(file.read_text()))[0]
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

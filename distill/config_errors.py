"""One line for a config that jsonargparse, a constructor or Lightning's Trainer refuses:
the field, the value, what is allowed.

jsonargparse reports a bad value as an indented tree (every member of a union, every key of a
nested class) after printing the whole usage text; a class path that does not import ends there
too. A constructor's own `ValueError` comes wrapped in such a tree; Lightning's Trainer raises
from inside its constructor. `parse_error_line`, `instantiate_error_line` and `trainer_error_line`
reduce each to the line `distill fit` prints. For a class path the allowed values are the
registered classes: the subclasses of the field's type that are imported (the project's own are,
see `REGISTRIES`), as jsonargparse itself resolves them.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import typing
from typing import Any

# Modules whose classes a config may name by class path; imported before listing a type's
# subclasses, so every registered divergence, module, callback and logger is listed.
REGISTRIES = (
    "distill.losses",
    "distill.module",
    "distill.rl",
    "distill.callbacks",
    "lightning.pytorch.loggers",
)
MAX_LISTED = 20

_KEY = re.compile(r'^Parser key "(?P<key>[^"]+)":$')
_CLASS = re.compile(r"^Problem with given class_path '(?P<cls>[^']+)':$")
# Lines of jsonargparse's report that describe its own search, not what is wrong.
_NOISE = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value type:",
    "Given value:",
    "Expected a path but",
    "Expected a <class 'NoneType'>",
    "Expected a <class 'bool'>",
    "Expected a <class 'collections.abc.Iterable'>",
    "Not a valid subclass of",
    "Subclass types expect one of",
    "a class path (str)",
    "a dict with",
    "a dict without",
)
# A reason that says the value is not a usable class (rather than a bad value of a plain type).
_NOT_A_CLASS = (
    "has no attribute",
    "No module named",
    "dot import path",
    "does not correspond to a subclass",
    "expects a function or a callable class",
    "not a subclass",
)
_OPTION = re.compile(r"^Option '(?P<option>[^']+)' is not accepted$")
_EXPECTED = re.compile(r"^Expected a <class '(?:\w+\.)*(?P<type>\w+)'>\. Got value: (?P<value>.*)$")
_EXPECTED_BARE = re.compile(r"^Expected a <class '(?:\w+\.)*(?P<type>\w+)'>$")
_LITERAL = re.compile(r"^Expected a typing\.Literal\[(?P<values>.*)\]$")
_GIVEN = re.compile(r"^Given value: (?:NestedArg\(key='[^']*', val=(?P<nested>.*)\)|(?P<plain>.*))$")


def _lines(message: str) -> list[tuple[int, str]]:
    """(indent, text without its list dash) for each non-empty line."""
    out = []
    for raw in message.splitlines():
        text = raw.lstrip(" -")
        if text.strip():  # a list item's dash counts as indent: its continuation lines nest under it
            out.append((len(raw) - len(raw.lstrip(" ")), text.strip()))
    return out


def _noise(text: str) -> bool:
    return text.startswith(_NOISE)


def _children(lines: list[tuple[int, str]], at: int) -> list[str]:
    """The meaningful lines nested under line `at`."""
    indent, out = lines[at][0], []
    for child_indent, text in lines[at + 1 :]:
        if child_indent <= indent:
            break
        if not _noise(text) and not _KEY.match(text) and not _CLASS.match(text):
            out.append(text)
    return out


def _chain(lines: list[tuple[int, str]], at: int) -> list[str]:
    """Line `at` and the structural lines it is nested in, outermost first."""
    chain, indent = [lines[at][1]], lines[at][0]
    for i in range(at - 1, -1, -1):
        if lines[i][0] < indent:
            indent = lines[i][0]
            if _KEY.match(lines[i][1]) or _CLASS.match(lines[i][1]):
                chain.append(lines[i][1])
    return chain[::-1]


def _field(chain: list[str]) -> tuple[str, str | None, str | None]:
    """(the dotted field the innermost key names, the class path that owns it (None at the top),
    the innermost class path)."""
    field, owner, current = "", None, None
    for text in chain:
        if key := _KEY.match(text):
            owner = current
            field = f"{field}.init_args.{key['key']}" if current else key["key"]
        elif cls := _CLASS.match(text):
            current = cls["cls"]
    return field, owner, current


def _import(path: str | None) -> Any:
    if not path:
        return None
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _field_type(parser, field: str, owner: str | None) -> Any:
    """The declared type of `field`: its parameter of the owning class, or the parser's own."""
    if owner is not None:
        cls = _import(owner)
        name = field.rsplit(".", 1)[-1]
        try:
            return typing.get_type_hints(cls.__init__).get(name)
        except Exception:  # unresolvable annotations: fall back to the raw one
            param = inspect.signature(cls).parameters.get(name) if cls is not None else None
            return None if param is None else param.annotation
    for action in getattr(parser, "_actions", []):
        if action.dest == field and getattr(action, "_typehint", None) is not None:
            return action._typehint
    section, _, name = field.partition(".")
    if section == "trainer":  # LightningCLI adds the Trainer's arguments with these types
        import lightning as L

        return typing.get_type_hints(L.Trainer.__init__).get(name)
    return None


def registered_classes(typehint: Any) -> tuple[list[str], list[str]]:
    """(import paths of the imported subclasses a field of this type accepts, the project's own
    first, the bases themselves left out; the bases' names)."""
    if typehint is None:
        return [], []
    from jsonargparse._typehints import get_all_subclass_paths, get_class_types

    for module in REGISTRIES:
        try:
            importlib.import_module(module)
        except ImportError:
            continue
    try:
        bases = get_class_types(typehint)
        paths = get_all_subclass_paths(typehint)
    except Exception:  # a type jsonargparse cannot walk: no list
        return [], []
    base_paths = {f"{b.__module__}.{b.__qualname__}" for b in bases} | {b.__name__ for b in bases}
    known = [p for p in paths if p not in base_paths and _import(p) not in bases]
    known.sort(key=_listing_order)
    return known, list(dict.fromkeys(b.__name__ for b in bases))


def _listing_order(path: str) -> tuple:
    """The project's own classes first, by defining module and then by line (the order they are
    written in), so the list is the same whatever was imported first; others after, by path."""
    cls = _import(path)
    module = getattr(cls, "__module__", "") or ""
    try:
        line = inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        line = 0
    return (not path.startswith("distill."), module, line, path)


def _listed(names: list[str]) -> str:
    more = f" (and {len(names) - MAX_LISTED} more)" if len(names) > MAX_LISTED else ""
    return ", ".join(names[:MAX_LISTED]) + more


def _given(lines: list[tuple[int, str]]) -> str | None:
    for _, text in lines:
        if given := _GIVEN.match(text):
            value = given["nested"] if given["nested"] is not None else given["plain"]
            return value.strip("'\"")
    return None


def _class_choice(field: str, value: str | None, reason: str, typehint: Any) -> str:
    broken = re.match(r"(?:cannot import name|No module named) '([^']+)'", reason)
    if broken and value and broken[1] not in value:  # the class exists; its module fails to import
        return f"{field}: {value} does not import: {reason}"
    known, bases = registered_classes(typehint)
    what = f"a subclass of {' or '.join(bases)}" if bases else "an importable class"
    allowed = f"{what}, one of: {_listed(known)}" if known else what
    return f"{field} must be {allowed}; got {value!r} ({reason})"


def parse_error_line(message: str, parser=None) -> str:
    """jsonargparse's report of a value it refused, as one line."""
    lines = _lines(message)
    if not lines:
        return message.strip()
    first = lines[0][1]
    if first.startswith("unrecognized arguments:") and parser is not None:
        given = first.split(":", 1)[1].split()
        options = [o for o in getattr(parser, "_option_string_actions", {}) if o.startswith("--")]
        guesses = [m for g in given if g.startswith("--") for m in difflib.get_close_matches(g, options, 1)]
        return f"{first} (did you mean {guesses[0]}?)" if guesses else first
    structural = [i for i, (_, text) in enumerate(lines) if _KEY.match(text) or _CLASS.match(text)]
    if not structural:
        return " ".join(text for _, text in lines if not _noise(text)) or first
    deepest = max(structural, key=lambda i: (lines[i][0], -i))
    chain = _chain(lines, deepest)
    field, owner, current = _field(chain)
    reasons = _children(lines, deepest)
    reason = reasons[0] if reasons else ""
    if _CLASS.match(lines[deepest][1]):  # the class path of `field` is refused, or one of its options
        if option := _OPTION.match(reason):
            cls = _import(current)
            takes = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
            return (
                f"{field}.init_args.{option['option']}: {current} has no option "
                f"{option['option']!r}; it takes: {', '.join(takes)}"
            )
        return _class_choice(field, current, reason, _field_type(parser, field, owner))
    value = _given(lines)
    literals = [m["values"] for r in reasons if (m := _LITERAL.match(r))]
    if literals:
        return f"{field} must be one of [{', '.join(literals)}], got {value!r}"
    if any(marker in r for r in reasons for marker in _NOT_A_CLASS):
        why = next(r for r in reasons if any(marker in r for marker in _NOT_A_CLASS))
        why = re.sub(r"^Type .* expects a function or a callable class: ", "", why)
        why = re.sub(r"\. Got value: .*$", "", why)
        return _class_choice(field, value, why, _field_type(parser, field, owner))
    if expected := _EXPECTED.match(reason):
        return f"{field} must be of type {expected['type']}, got {expected['value']!r}"
    if (expected := _EXPECTED_BARE.match(reason)) and value is not None:  # a union's last member
        return f"{field} must be of type {expected['type']}, got {value!r}"
    return f"{field}: {reason}" if reason else f"{field}: {first}"


def instantiate_error_line(message: str, locate=None) -> str:
    """A constructor's error as jsonargparse wraps it (a union's report): the constructor's own
    line (the project's name their field), or the class path's field (`locate(class_path)`) and
    class before the reason."""
    lines = _lines(message)
    if len(lines) <= 1 or "Union subtypes" not in lines[0][1]:
        texts = [text for _, text in lines]
        return " ".join(texts) if len(texts) <= 3 else texts[0]
    for i, (_, text) in enumerate(lines):
        if cls := _CLASS.match(text):
            reasons = _children(lines, i)
            field = locate(cls["cls"]) if locate is not None else None
            return f"{field + ': ' if field else ''}{cls['cls']}: {reasons[0] if reasons else text}"
    causes = [text for _, text in lines[1:] if not _noise(text) and not text.startswith("Expected a <class")]
    cause = causes[0] if causes else lines[0][1]
    # The project's own classes name their field in their messages; another's (a logger's) do not.
    given = re.search(r"class_path='([^']+)'", message)
    if given and not given[1].startswith("distill.") and locate is not None:
        return f"{locate(given[1]) or 'config'}: {given[1]}: {cause}"
    return cause


def class_path_field(config: Any, class_path: str, prefix: str = "") -> str | None:
    """The dotted field of `config` (nested mappings/Namespaces and lists) whose `class_path` is
    `class_path`; list items as `field[i]`."""
    if hasattr(config, "as_dict"):
        config = config.as_dict()
    if isinstance(config, dict):
        if config.get("class_path") == class_path:
            return prefix or None
        for key, value in config.items():
            found = class_path_field(value, class_path, f"{prefix}.{key}" if prefix else str(key))
            if found:
                return found
    elif isinstance(config, (list, tuple)):
        for i, item in enumerate(config):
            found = class_path_field(item, class_path, f"{prefix}[{i}]")
            if found:
                return found
    return None


def trainer_error_line(err: Exception) -> str:
    """A `ValueError` or `MisconfigurationException` from Lightning's Trainer constructor, as
    `trainer.<field>: <message>` (the field: the first Trainer argument the message names)."""
    import lightning as L

    message = " ".join(str(err).split())
    params = set(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
    named = [w for w in re.findall(r"[A-Za-z_]+", message) if w in params]
    return f"trainer.{named[0]}: {message}" if named else f"trainer: {message}"

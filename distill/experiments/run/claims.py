"""Claims files: the paper's claims declared as primary contrasts, before a sweep runs.

A claims file is YAML (e.g. `experiments/claims/v2.yaml`)::

    world: tiny world v2                # what the archives ran on (printed with the verdicts)
    results: results                    # the archives' directory, relative to this file
    level: 0.95                         # family-wise confidence; Holm over every claim below
    claims:
      - id: forward_kl_robust           # [a-z0-9_]+, unique
        claim: forward KL is robust to the rollout policy    # the paper's claim, in words
        archive: tiny_grid              # <sweep name> or <sweep name>/<stage>, under `results`
        metric: test/countdown3/accuracy
        a: {mix: 0}                     # the effect is a − b: runs with these knob values ...
        b: {mix: 1}                     # ... against runs with these
        within: {divergence: forward_kl}   # optional: only these runs
        strata: [lr]                    # fixed factors: an effect per value, then their average
        paired: [seed]                  # a run of a and one of b form a pair when these agree
        predicts: none                  # increase (a − b > 0), decrease (< 0), none (|a − b| small)
        sesoi: 0.03                     # smallest effect of interest, in the metric's units
        testable: {margin: 0.10, floor: 0.05, ceiling: 0.95}   # optional, see below
        transform: log                  # optional: compare log(metric) (ratios)
        baseline: tiny_rlvr/distill     # optional: the metric minus the parent run's, for a
                                        #   chained stage (e.g. the gain from RLVR)
        why: ...                        # optional: why this metric, pairing or bound
        was: on_policy_harder           # optional: the id this claim had in an earlier claims
                                        #   file, when it differs (`distill report --beside`)

Every knob of the archive that varies must be named once: in `a`/`b`, `within`, `strata` or
`paired`, so how runs are matched is declared, never inferred. `testable` makes a claim *not
testable* when the teacher is not ahead of the start by `margin` on the metric, when the start is
at or below `floor` or at or above `ceiling`, when the teacher is at or below `floor`, or when every
run of the contrast is at the floor, or every run at the ceiling (`distill.experiments.stats.verdicts`).
A sweep attaches its claims file in its archive's `sweep.json` (`"claims":
"experiments/claims/v2.yaml"`, relative to the repository root), or `distill report --claims FILE`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PREDICTIONS = ("increase", "decrease", "none")
TRANSFORMS = ("log",)
ID = re.compile(r"[a-z0-9_]+")
ARCHIVE = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?")
TOP_KEYS = ("world", "results", "level", "note", "claims")
CLAIM_KEYS = (
    "id",
    "claim",
    "archive",
    "metric",
    "a",
    "b",
    "within",
    "strata",
    "paired",
    "predicts",
    "sesoi",
    "testable",
    "transform",
    "baseline",
    "why",
    "was",
)
REQUIRED = ("id", "claim", "archive", "metric", "a", "b", "paired", "predicts", "sesoi")
TESTABLE_KEYS = ("margin", "floor", "ceiling")


class ClaimsError(ValueError):
    """A claims file that cannot be applied; the message names the field, the value and what is allowed."""


@dataclass(frozen=True)
class Testable:
    margin: float | None = None
    floor: float | None = None
    ceiling: float | None = None


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    archive: str
    metric: str
    a: dict[str, Any]
    b: dict[str, Any]
    paired: tuple[str, ...]
    predicts: str
    sesoi: float
    within: dict[str, Any] = field(default_factory=dict)
    strata: tuple[str, ...] = ()
    testable: Testable = Testable()
    transform: str | None = None
    baseline: str | None = None
    why: str = ""
    was: str | None = None  # its id in an earlier claims file, when that differs

    @property
    def sweep(self) -> str:
        """The sweep (archive directory) the claim reads: the first part of `archive`."""
        return self.archive.split("/")[0]

    def knobs(self) -> set[str]:
        return set(self.a) | set(self.within) | set(self.strata) | set(self.paired)


@dataclass(frozen=True)
class ClaimsFile:
    path: Path
    results: Path
    level: float
    world: str
    note: str
    claims: tuple[Claim, ...]


def _number(where: str, value: Any, low: float | None = None, open_low: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if open_low else value >= low
    if not ok:
        bound = "" if low is None else f" {'>' if open_low else '>='} {low:g}"
        raise ClaimsError(f"{where}: {value!r} is not allowed; allowed: a finite number{bound}")
    return float(value)


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ClaimsError(f"{where}: {value!r} is not allowed; allowed: a non-empty string")
    return value


def _mapping(where: str, value: Any, empty: bool = False) -> dict[str, Any]:
    if value is None and empty:
        return {}
    if not isinstance(value, dict) or (not value and not empty) or not all(isinstance(k, str) for k in value):
        raise ClaimsError(f"{where}: {value!r} is not allowed; allowed: a mapping of knob -> value")
    for knob, v in value.items():
        if isinstance(v, (list, dict)) or v is None:
            raise ClaimsError(f"{where}.{knob}: {v!r} is not allowed; allowed: one knob value")
    return dict(value)


def _names(where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ClaimsError(f"{where}: {value!r} is not allowed; allowed: a list of knob names")
    if len(set(value)) < len(value):
        raise ClaimsError(f"{where}: {value!r} names a knob twice; allowed: each knob once")
    return tuple(value)


def _choice(where: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ClaimsError(f"{where}: {value!r} is not allowed; allowed: {', '.join(allowed)}")
    return value


def _testable(where: str, value: Any) -> Testable:
    if value is None:
        return Testable()
    if not isinstance(value, dict):
        raise ClaimsError(
            f"{where}: {value!r} is not allowed; allowed: a mapping with {', '.join(TESTABLE_KEYS)}"
        )
    _unknown(where, value, TESTABLE_KEYS)
    out = Testable(**{k: _number(f"{where}.{k}", v, 0.0) for k, v in value.items()})
    if out.floor is not None and out.ceiling is not None and not out.floor < out.ceiling:
        raise ClaimsError(
            f"{where}: floor {out.floor:g} >= ceiling {out.ceiling:g}; allowed: floor < ceiling"
        )
    return out


def _unknown(where: str, data: dict, allowed: tuple[str, ...]) -> None:
    unknown = [k for k in data if k not in allowed]
    if unknown:
        raise ClaimsError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")


def _claim(where: str, data: Any) -> Claim:
    if not isinstance(data, dict):
        raise ClaimsError(f"{where}: {data!r} is not allowed; allowed: a mapping of the claim's fields")
    if isinstance(data.get("id"), str):
        where = f"{where} ({data['id']})"
    _unknown(where, data, CLAIM_KEYS)
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ClaimsError(f"{where}: missing {missing[0]!r}; required: {', '.join(REQUIRED)}")
    if not isinstance(data["id"], str) or not ID.fullmatch(data["id"]):
        raise ClaimsError(f"{where}.id: {data['id']!r} is not allowed; allowed: [a-z0-9_]+")
    if data.get("was") is not None and not (isinstance(data["was"], str) and ID.fullmatch(data["was"])):
        raise ClaimsError(f"{where}.was: {data['was']!r} is not allowed; allowed: [a-z0-9_]+")
    for key in ("archive", "baseline"):
        if data.get(key) is not None and not (isinstance(data[key], str) and ARCHIVE.fullmatch(data[key])):
            raise ClaimsError(
                f"{where}.{key}: {data[key]!r} is not allowed; allowed: <sweep> or <sweep>/<stage>"
            )
    a, b = _mapping(f"{where}.a", data["a"]), _mapping(f"{where}.b", data["b"])
    if set(a) != set(b) or a == b:
        raise ClaimsError(
            f"{where}: sides a {a} and b {b} are not allowed; allowed: the same knobs with different values"
        )
    claim = Claim(
        id=data["id"],
        claim=_text(f"{where}.claim", data["claim"]),
        archive=data["archive"],
        metric=_text(f"{where}.metric", data["metric"]),
        a=a,
        b=b,
        paired=_names(f"{where}.paired", data["paired"]),
        predicts=_choice(f"{where}.predicts", data["predicts"], PREDICTIONS),
        sesoi=_number(f"{where}.sesoi", data["sesoi"], 0.0, open_low=True),
        within=_mapping(f"{where}.within", data.get("within"), empty=True),
        strata=_names(f"{where}.strata", data.get("strata")),
        testable=_testable(f"{where}.testable", data.get("testable")),
        transform=None
        if data.get("transform") is None
        else _choice(f"{where}.transform", data["transform"], TRANSFORMS),
        baseline=data.get("baseline"),
        why="" if data.get("why") is None else _text(f"{where}.why", data["why"]),
        was=data.get("was"),
    )
    groups = [
        ("a", set(a)),
        ("within", set(claim.within)),
        ("strata", set(claim.strata)),
        ("paired", set(claim.paired)),
    ]
    for i, (name, knobs) in enumerate(groups):
        for other, more in groups[i + 1 :]:
            if knobs & more:
                knob = sorted(knobs & more)[0]
                raise ClaimsError(
                    f"{where}: knob {knob!r} is in both {name} and {other}; allowed: one role a knob"
                )
    if claim.baseline is not None and claim.baseline.split("/")[0] != claim.sweep:
        raise ClaimsError(
            f"{where}.baseline: {claim.baseline!r} is not allowed; allowed: a stage of {claim.sweep}"
        )
    return claim


def load_claims(path: Path) -> ClaimsFile:
    """Read and check a claims file; a `ClaimsError` names the first field that is wrong."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ClaimsError(f"claims file {str(path)!r}: cannot be read ({err.strerror or err})") from err
    except yaml.YAMLError as err:
        raise ClaimsError(f"claims file {str(path)!r}: not YAML ({str(err).splitlines()[0]})") from err
    where = f"claims file {path}"
    if not isinstance(data, dict):
        raise ClaimsError(f"{where}: {data!r} is not allowed; allowed: a mapping with {', '.join(TOP_KEYS)}")
    _unknown(where, data, TOP_KEYS)
    if not isinstance(data.get("claims"), list) or not data["claims"]:
        raise ClaimsError(
            f"{where}: claims: {data.get('claims')!r} is not allowed; allowed: a non-empty list"
        )
    level = _number(f"{where}: level", data.get("level", 0.95), 0.0, open_low=True)
    if not level < 1:
        raise ClaimsError(f"{where}: level: {level!r} is not allowed; allowed: a number in (0, 1)")
    claims = tuple(_claim(f"{where}: claims[{i}]", c) for i, c in enumerate(data["claims"]))
    seen: set[str] = set()
    for i, claim in enumerate(claims):
        if claim.id in seen:
            raise ClaimsError(f"{where}: claims[{i}].id: {claim.id!r} is declared twice; allowed: unique ids")
        seen.add(claim.id)
    results = path.parent / _text(f"{where}: results", data.get("results", "results"))
    world = "" if data.get("world") is None else _text(f"{where}: world", data["world"])
    note = "" if data.get("note") is None else _text(f"{where}: note", data["note"])
    return ClaimsFile(path, results, level, world, note, claims)

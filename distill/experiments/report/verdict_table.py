"""The verdict table of `distill report`: which claims file applies to a sweep, and the claims'
verdicts (`distill.experiments.stats.verdicts`) as markdown and JSON.

A sweep's claims file is named in its `sweep.json` (`"claims": "experiments/claims/v2.yaml"`,
relative to the repository root: the first ancestor of the sweep directory that holds the path)
or given with `distill report --claims FILE`. The report of a sweep shows the claims that read it
(`archive: <its name>[/<stage>]`); Holm's family is always the whole file, so every report
shows the same verdict for a claim. `distill report --claims FILE` alone prints the whole table.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from distill.experiments.run import sweep_record
from distill.experiments.run.axes import format_value
from distill.experiments.run.claims import Claim, ClaimsError, ClaimsFile, load_claims
from distill.experiments.run.records import is_share
from distill.experiments.run.sweep_record import read_sweep_record
from distill.experiments.stats.intervals import Estimate
from distill.experiments.stats.verdicts import Verdict, evaluate, stage_dir

CLAIMS_KEY = "claims"
_FAMILIES: dict[tuple, list[Verdict]] = {}  # one evaluation per claims file and sweep directories
DEPENDENT_BELOW = 0.05  # the independence check's p below which a claim's pairs get a caveat


def attached_claims(sweep_dir: Path) -> tuple[Path, str] | None:
    """(path, the name `sweep.json` gives it) of the claims file a sweep names, or None."""
    named = read_sweep_record(sweep_dir).get(CLAIMS_KEY)
    if not isinstance(named, str) or not named:
        return None
    for parent in [Path(sweep_dir).resolve(), *Path(sweep_dir).resolve().parents]:
        if (parent / named).is_file():
            return parent / named, named
    raise ClaimsError(f"{sweep_dir}/sweep.json: claims file {named!r} not found above {sweep_dir}")


def family(claims: ClaimsFile, sweep_dirs: dict[str, Path]) -> list[Verdict]:
    """Every claim's verdict, evaluated once a process for a claims file and sweep directories as
    they stand (the claims as read, and the fingerprint of every archive they read, are the key)."""
    results = claims.results.resolve()
    sweep_dirs = {k: v for k, v in sweep_dirs.items() if Path(v).resolve() != results / k}
    sweeps = sorted(
        {
            stage_dir(a.split("/")[0], sweep_dirs, claims.results)
            for c in claims.claims
            for a in (c.archive, c.baseline)
            if a
        }
    )
    key = (
        repr(claims),
        tuple(sorted((k, str(Path(v).resolve())) for k, v in sweep_dirs.items())),
        tuple(_fingerprint(s) for s in sweeps),
    )
    if key not in _FAMILIES:
        _FAMILIES[key] = evaluate(claims, sweep_dirs)
    return _FAMILIES[key]


def _fingerprint(sweep: Path) -> str | None:
    """What a sweep directory's verdicts depend on, as a digest: the path, size and modification
    time of every file outside its reports, and the bytes of every JSON and YAML file among them
    (metrics, settings, references, stages), so a `metrics.json` rewritten in place within one
    clock tick still counts. None for a directory that is not there."""
    if not sweep.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(sweep.rglob("*")):
        where = path.relative_to(sweep)
        if "report" in where.parts or not path.is_file():
            continue
        stat = path.stat()
        digest.update(f"{where}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        if path.suffix in (".json", ".yaml"):
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _fmt(claim: Claim, value: float, signed: bool = True) -> str:
    if not math.isfinite(value):
        return "—"
    if claim.transform == "log":
        return f"×{math.exp(value):.3g}"
    if is_share(claim.metric):
        return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"
    return f"{value:+.3g}" if signed else f"{value:.3g}"


def _unit(claim: Claim) -> str:
    return " pp" if is_share(claim.metric) and claim.transform != "log" else ""


def _interval(claim: Claim, est: Estimate | None) -> str:
    if est is None:
        return "—"
    point = _fmt(claim, est.point) + _unit(claim)
    if not est.has_interval or est.se == 0:  # no spread: no interval, not a zero-width one
        return point
    return f"{point} [{_fmt(claim, est.low)}, {_fmt(claim, est.high)}]"


def _sides(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={format_value(v)}" for k, v in values.items())


def _contrast(claim: Claim) -> str:
    metric = f"log {claim.metric}" if claim.transform == "log" else claim.metric
    if claim.baseline:
        metric = f"Δ {metric} ({claim.archive.split('/')[-1]} − {claim.baseline.split('/')[-1]})"
    text = f"`{metric}`: {_sides(claim.a)} − {_sides(claim.b)}"
    if claim.within:
        text += f" within {_sides(claim.within)}"
    if claim.strata:
        text += f"; per {', '.join(claim.strata)}"
    return text + (f"; paired by {', '.join(claim.paired)}" if claim.paired else "")


def _predicts(claim: Claim) -> str:
    if claim.predicts == "none":
        return f"none (within ±{_fmt(claim, claim.sesoi, False)}{_unit(claim)})"
    return f"{'> 0' if claim.predicts == 'increase' else '< 0'} (s = {_fmt(claim, claim.sesoi, False)}{_unit(claim)})"


def _method(est: Estimate | None) -> str:
    if est is None or not est.has_interval or est.se == 0:
        return "—"
    how = "t" if est.method == "t" else f"bootstrap, {est.resamples:,} resamples"
    return f"{how}, {100 * est.level:.4g} %"


def _mde(v: Verdict) -> str:
    return _fmt(v.claim, v.mde, False) + _unit(v.claim) if math.isfinite(v.mde) else "—"


def _pairs(v: Verdict) -> str:
    return str(v.estimate.n) if v.estimate is not None else "0"


def _verdict(v: Verdict, reason: bool = True) -> str:
    """The verdict in bold, with its reason (a caveat such as "but smaller than ±s" follows a comma)."""
    if not (reason and v.reason):
        return f"**{v.verdict}**"
    return f"**{v.verdict}**{',' if v.reason.startswith('but ') else ':'} {v.reason}"


def caveats(verdicts: list[Verdict]) -> list[str]:
    """After a verdict table: a blank line, then a line for each claim whose pairs that share a seed
    (the first `paired` knob) differ alike, since the interval takes them as independent and may
    then be too narrow. Nothing when no claim's check fires."""
    lines = []
    for v in verdicts:
        check = v.independence
        if check is not None and check.p < DEPENDENT_BELOW:
            lines.append(
                f"- `{v.claim.id}`: pairs that share a {check.knob} differ alike (F = {check.f:.2f} on "
                f"{check.df1} and {check.df2} df, p = {check.p:.3f}); the interval takes the pairs as "
                "independent and may be too narrow."
            )
    return ["", *lines] if lines else []


def rows(verdicts: list[Verdict]) -> list[list[str]]:
    out = []
    for v in verdicts:
        c = v.claim
        per = "; ".join(f"{label}: {_interval(c, e)}" for label, e in v.strata) if len(v.strata) > 1 else ""
        verdict = _verdict(v)
        shown = v.adjusted or v.estimate
        out.append(
            [
                c.claim,
                f"`{c.archive}`",
                _contrast(c),
                _predicts(c),
                _interval(c, shown),
                _method(shown),
                per or "—",
                _pairs(v),
                _mde(v),
                verdict,
            ]
        )
    return out


HEADER = [
    "claim",
    "archive",
    "contrast (a − b)",
    "predicts",
    "effect [Holm-adjusted interval]",
    "interval",
    "per stratum [95 %]",
    "pairs",
    "MDE (80 %)",
    "verdict",
]


def table(verdicts: list[Verdict]) -> list[str]:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows(verdicts)]


def family_size(verdicts: list[Verdict]) -> int:
    return sum(v.verdict != "not testable" for v in verdicts)


def intro(claims: ClaimsFile, name: str, size: int) -> list[str]:
    world = f" on {claims.world}" if claims.world else ""
    return [
        f"Declared in `{name}`{world}: each claim a primary contrast. Effect: the equal-weight mean over the "
        "strata of the mean paired difference a − b. Interval: Student's t below 10 pairs a stratum "
        "(Welch–Satterthwaite df over strata), a stratified percentile bootstrap from 10 on, at the level "
        f"Holm's step-down tests the claim in the family of {size} testable claims "
        # The committed reports and the docs quote this sentence byte for byte, so it keeps the
        # verdicts' short dotted name; the module is distill.experiments.stats.verdicts.
        f"(family-wise {100 * claims.level:.4g} %). Verdicts by rule (`distill.experiments.verdicts`, "
        "docs/study.md): replicated, contradicted, no effect, unresolved (with the minimum detectable "
        "effect at 80 % power), not testable.",
    ]


def as_json(claims: ClaimsFile, name: str, verdicts: list[Verdict], size: int) -> dict[str, Any]:
    def num(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else round(float(x), 10)

    def checked(v: Verdict) -> dict[str, Any] | None:
        i = v.independence
        return None if i is None else {"knob": i.knob, "F": num(i.f), "df": [i.df1, i.df2], "p": num(i.p)}

    def est(e: Estimate | None) -> dict[str, Any] | None:
        if e is None:
            return None
        fields = ("point", "low", "high", "se", "df", "p", "level")
        return {
            **{k: num(getattr(e, k)) for k in fields},
            "pairs": e.n,
            "method": e.method,
            "resamples": e.resamples,
        }

    return {
        "claims": name,
        "world": claims.world,
        "level": claims.level,
        "family": size,
        "verdicts": [
            {
                "id": v.claim.id,
                "claim": v.claim.claim,
                "archive": v.claim.archive,
                "metric": v.claim.metric,
                "transform": v.claim.transform,
                "baseline": v.claim.baseline,
                "a": v.claim.a,
                "b": v.claim.b,
                "within": v.claim.within,
                "strata": list(v.claim.strata),
                "paired": list(v.claim.paired),
                "predicts": v.claim.predicts,
                "sesoi": v.claim.sesoi,
                "verdict": v.verdict,
                "reason": v.reason,
                "estimate": est(v.estimate),
                "adjusted": est(v.adjusted),
                "p_adjusted": num(v.p_adjusted),
                "mde": num(v.mde),
                "per_stratum": [{"stratum": label, **est(e)} for label, e in v.strata],
                "independence": checked(v),
                "start": num(v.start),
                "teacher": num(v.teacher),
            }
            for v in verdicts
        ],
    }


def files(claims: ClaimsFile, name: str, verdicts: list[Verdict], size: int) -> dict[str, str]:
    """The text of `verdicts.md` and `verdicts.json`."""
    md = ["# Verdicts", "", *intro(claims, name, size), "", *table(verdicts), *caveats(verdicts), ""]
    return {
        "verdicts.md": "\n".join(md),
        "verdicts.json": json.dumps(as_json(claims, name, verdicts, size), indent=1) + "\n",
    }


def write(claims: ClaimsFile, name: str, verdicts: list[Verdict], size: int, out: Path) -> None:
    """`verdicts.md` and `verdicts.json` in `out`."""
    _put_all(out, files(claims, name, verdicts, size))


def _cells(v: Verdict | None) -> list[str]:
    """effect [Holm-adjusted interval], pairs, MDE and verdict of one claim (why, when not testable
    or without an interval; the caveat of an effect smaller than ±s)."""
    if v is None:
        return ["—", "—", "—", "not declared"]
    no_interval = v.adjusted is None and v.estimate is not None
    why = v.verdict == "not testable" or no_interval or v.reason.startswith("but ")
    return [_interval(v.claim, v.adjusted or v.estimate), _pairs(v), _mde(v), _verdict(v, why)]


def beside(verdicts: list[Verdict], earlier: list[Verdict], labels: tuple[str, str]) -> list[str]:
    """The outcome table: one row per claim, this file's verdict beside the earlier file's claim of
    the same id (or the id its `was` names). Claims only the earlier file declares come last."""
    now, then = labels
    header = ["claim", "id"] + [f"{who}: {what}" for who in (now, then) for what in _BESIDE]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_id = {v.claim.id: v for v in earlier}
    ids = [v.claim.was or v.claim.id for v in verdicts]

    def row(*cells: str) -> str:
        return "| " + " | ".join(cells) + " |"

    for v, was in zip(verdicts, ids, strict=True):
        named = f"`{v.claim.id}`" + (f" (was `{was}`)" if was != v.claim.id else "")
        lines.append(row(v.claim.claim, named, *_cells(v), *_cells(by_id.get(was))))
    lines += [
        row(v.claim.claim, f"`{v.claim.id}`", *_cells(None), *_cells(v))
        for v in earlier
        if v.claim.id not in ids
    ]
    return lines


_BESIDE = ("effect [Holm-adjusted interval]", "pairs", "MDE (80 %)", "verdict")


def section(sweep_dir: Path, sweep_name: str, claims_path: Path, name: str, out: Path) -> list[str]:
    """The report's verdict section for the claims that read this sweep (also written to
    `out/verdicts.md` and `out/verdicts.json`)."""
    lines, texts = _section(sweep_dir, sweep_name, claims_path, name)
    _put_all(out, texts)
    return lines


def _put_all(out: Path, texts: dict[str, str | None]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for file, text in texts.items():
        put(out / file, text)


def put(path: Path, text: str | None) -> None:
    """Write `text` to `path`, or remove the file where `text` is None."""
    if text is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(text)


def _section(
    sweep_dir: Path, sweep_name: str, claims_path: Path, name: str
) -> tuple[list[str], dict[str, str | None]]:
    """The section's lines and the verdict files' text (None: the file must not be there)."""
    claims = load_claims(claims_path)
    everything = family(claims, {sweep_name: sweep_dir})
    verdicts = [v for v in everything if v.claim.sweep == sweep_name]
    if not verdicts:
        no_claim = f"{_NO_CLAIM} `{name}` reads `{sweep_name}`: every table below is exploratory."
        return [no_claim, ""], dict.fromkeys(("verdicts.md", "verdicts.json"))
    size = family_size(everything)
    return [
        _SECTION_HEAD,
        "",
        *intro(claims, name, size),
        "",
        *table(verdicts),
        *caveats(verdicts),
        "",
        f"{_SECTION_TAIL} Everything below is exploratory: not declared in "
        f"`{name}`, so unadjusted for multiplicity and without a verdict.",
        "",
    ], files(claims, name, verdicts, size)


_SECTION_HEAD = "## Verdicts: the declared claims"
_SECTION_TAIL = "Also in `verdicts.md` and `verdicts.json`."
_NO_CLAIM = "No claim of"  # followed by the claims file's name in backticks


def refreshed(sweep_dir: Path) -> dict[Path, str | None]:
    """The verdict files of a reported archive that differ from what `distill report` would write
    now, each with its new whole text (None: to be removed): `report/verdicts.md`,
    `report/verdicts.json`, and `report/report.md` with its verdict section regenerated and the rest
    kept. Holm's family is the whole claims file, so an archive that lands moves the adjusted
    intervals of every archive the file reads (`make outcome` rewrites them, seconds). Empty for an
    archive without a report or whose `sweep.json` names no claims file (a report built with
    `--claims` is not one `make outcome` keeps); a ClaimsError when report.md has not exactly one
    verdict section."""
    sweep_dir = Path(sweep_dir)
    report = sweep_dir / "report" / "report.md"
    attached = attached_claims(sweep_dir)
    if attached is None or not report.is_file():
        return {}
    lines, texts = _section(sweep_dir, sweep_record.sweep_name(sweep_dir), *attached)
    old = report.read_text().split("\n")
    heads = [i for i, line in enumerate(old) if line == _SECTION_HEAD or line.startswith(f"{_NO_CLAIM} `")]
    if len(heads) != 1:
        raise ClaimsError(f"{report}: {len(heads)} verdict sections, expected one (regenerate the report)")
    start = heads[0]
    end = start + 2  # "No claim of ...", blank
    if old[start] == _SECTION_HEAD:
        tails = [i for i in range(start, len(old)) if old[i].startswith(_SECTION_TAIL)]
        if not tails:
            raise ClaimsError(f"{report}: the verdict section has no end (regenerate the report)")
        end = tails[0] + 2
    texts = {sweep_dir / "report" / k: v for k, v in texts.items()}
    texts[report] = "\n".join(old[:start] + lines + old[end:])
    return {
        path: text
        for path, text in texts.items()
        if (text is None and path.exists())
        or (text is not None and (not path.is_file() or path.read_text() != text))
    }


def claims_only(path: Path, out: Path | None, earlier: Path | None = None) -> int:
    """`distill report --claims FILE`: every claim's verdict, printed (and written into `out`);
    with `--beside EARLIER`, the outcome table of FILE's claims beside EARLIER's."""
    claims = load_claims(path)
    verdicts = family(claims, {})
    size = family_size(verdicts)
    if earlier is not None:
        before = load_claims(earlier)
        old = family(before, {})
        labels = (claims.world or str(path), before.world or str(earlier))
        lines = [
            f"The claims of `{path}` beside those of `{earlier}`, matched by id; each file's verdicts by "
            f"its own Holm family ({size} and {family_size(old)} testable claims).",
            "",
            *beside(verdicts, old, labels),
            *caveats(verdicts),
        ]
        print("\n".join(lines))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "outcome.md").write_text("\n".join(lines) + "\n")
        return 0
    print("\n".join([*intro(claims, str(path), size), "", *table(verdicts), *caveats(verdicts)]))
    if out is not None:
        write(claims, str(path), verdicts, size, out)
    return 0

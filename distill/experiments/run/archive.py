"""`distill report SWEEP_DIR --archive DEST`: the part of a sweep worth committing.

A sweep directory holds gigabytes of checkpoints, exported students, θ0 snapshots, event files and
rollout caches. The archive keeps what the report needs and what documents each run, so that
`distill report DEST` regenerates the same report from a git checkout:

- `sweep.json` at the top and in each stage directory of a staged sweep;
- per run directory (any directory holding `settings.json`, `metrics.json` or `overrides.yaml`):
  `settings.json`, `overrides.yaml`, `config.yaml` (the resolved config), `env.json` (package
  versions, git revision) and `metrics.json`, copied as they are, plus `curves.csv`: the
  TensorBoard scalars `records.ARCHIVED_TAGS` as `tag,step,value` rows, which `records.read_curves`
  reads when no event files are present;
- per reference run (`references/<kind>`, `distill.experiments.run.references`): the same files and its
  `test_metrics.json`, no curves (it does not train).

`distill sweep SPEC --archive DEST` archives each run the same way as soon as it finishes, and
skips the runs DEST holds finished (`served_from_archive`): committed as it grows, DEST is what
lets a sweep resume on a fresh checkout, where the sweep directory is gone.

Runs keep their paths relative to the sweep directory. Archiving again into the same DEST
replaces each run's files (a file the run no longer has is removed); a DEST holding runs that are
not in the sweep is refused, so two sweeps never mix in one report.
"""

from __future__ import annotations

import csv
import shutil
from dataclasses import replace
from pathlib import Path

from distill.experiments.run import rundirs
from distill.experiments.run.records import ARCHIVED_TAGS, CURVES, read_curves
from distill.experiments.run.references import DIRNAME as REFERENCES
from distill.experiments.run.references import TEST_METRICS
from distill.experiments.run.rundirs import OVERRIDES, SETTINGS, is_run_dir
from distill.experiments.run.spec import Run
from distill.experiments.run.sweep_record import SWEEP_RECORD, read_sweep_record
from distill.rundir import METRICS
from distill.runinfo import replace_atomic

RUN_FILES = (SETTINGS, OVERRIDES, "config.yaml", "env.json", METRICS, TEST_METRICS)
STATUS_FILES = (METRICS, TEST_METRICS)  # what makes a run (or a reference) done: copied last
SKIP_DIRS = {"checkpoints", "tensorboard", "student", "rollout_cache", "report"}


class ArchiveError(ValueError):
    """An archive destination inside the sweep, or one holding runs of another sweep."""


def _run_dirs(sweep_dir: Path) -> list[Path]:
    found = []
    for path in sorted(sweep_dir.iterdir()):
        if not path.is_dir() or path.name in SKIP_DIRS:
            continue
        if is_run_dir(path):
            found.append(path)
        else:  # a stage directory of a staged sweep
            found += _run_dirs(path)
    return found


def write_curves(run_dir: Path, path: Path) -> None:
    """Write the run's TensorBoard curves to `path` as CSV (`tag,step,value` rows)."""
    rows = [
        (tag, step, value)
        for tag, (steps, values) in sorted(read_curves(run_dir, ARCHIVED_TAGS).items())
        for step, value in zip(steps, values)
    ]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["tag", "step", "value"])
        writer.writerows((tag, step, repr(value)) for tag, step, value in rows)


def check_destination(sweep_dir: Path, dest: Path, wanted: set[Path], fingerprint: str | None) -> None:
    """Refuse an archive `dest` that is a file, inside `sweep_dir` or holding it, or that holds
    another sweep: a `sweep.json` whose fingerprint (`sweep_record.spec_fingerprint`) is not
    `fingerprint`, or (without fingerprints to compare) runs whose paths relative to the sweep
    directory are not in `wanted`. Two sweeps never mix in one archive; one with this sweep's
    fingerprint may hold runs the sweep directory lacks (a sweep resumed on a fresh clone)."""
    sweep_dir, dest = Path(sweep_dir), Path(dest)
    if dest.exists() and not dest.is_dir():
        raise ArchiveError(f"--archive {str(dest)!r} is a file, not a directory")
    inside = dest.resolve() == sweep_dir.resolve() or sweep_dir.resolve() in dest.resolve().parents
    if inside or dest.resolve() in sweep_dir.resolve().parents:
        raise ArchiveError(
            f"--archive {str(dest)!r} must lie outside the sweep directory {str(sweep_dir)!r} and not hold it"
        )
    if not dest.is_dir():
        return
    recorded = read_sweep_record(dest)
    if fingerprint is not None and recorded:
        if recorded.get("fingerprint") == fingerprint:
            return
        theirs = recorded.get("fingerprint") or "none: written before sweeps were fingerprinted"
        raise ArchiveError(
            f"--archive {str(dest)!r} holds sweep {recorded.get('name')!r} of another spec or other base "
            f"configs (fingerprint {theirs}; this sweep's {fingerprint}); archive into a new directory"
        )
    foreign = [p.relative_to(dest) for p in _run_dirs(dest) if p.relative_to(dest) not in wanted]
    if foreign:
        names = ", ".join(str(p) for p in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise ArchiveError(
            f"--archive {str(dest)!r} holds {len(foreign)} runs that are not in {str(sweep_dir)!r} "
            f"({names}); archive into a new directory or remove them first"
        )


def copy_records(sweep_dir: Path, dest: Path) -> None:
    """Copy the sweep's `sweep.json` files (the top one and each stage's) into `dest`."""
    for meta in sorted(Path(sweep_dir).rglob(SWEEP_RECORD)):
        if not SKIP_DIRS.intersection(meta.relative_to(sweep_dir).parts):
            target = Path(dest) / meta.relative_to(sweep_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(meta, target)


def archive_run(sweep_dir: Path, run_dir: Path, dest: Path) -> Path:
    """Copy one run's committable files into `dest` (at its path relative to `sweep_dir`),
    replacing an earlier copy's; returns the archived run directory. The files that mark a run
    done (`metrics.json`, a reference's `test_metrics.json`) go last, each written whole, so an
    archive cut short mid-copy never reads as done."""
    run_dir = Path(run_dir)
    target = Path(dest) / run_dir.relative_to(sweep_dir)
    target.mkdir(parents=True, exist_ok=True)
    for name in (*STATUS_FILES, *RUN_FILES, CURVES):  # an earlier copy must not outlive its source
        (target / name).unlink(missing_ok=True)
    for name in RUN_FILES:
        if name not in STATUS_FILES and (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, target / name)
    if run_dir.parent.name == REFERENCES:  # evaluation only: no training curves
        pass
    elif (run_dir / "tensorboard").is_dir():
        replace_atomic(target / CURVES, lambda tmp: write_curves(run_dir, tmp))
    elif (run_dir / CURVES).is_file():  # archiving an archive
        replace_atomic(target / CURVES, lambda tmp: shutil.copyfile(run_dir / CURVES, tmp))
    for name in STATUS_FILES:
        if (run_dir / name).is_file():
            replace_atomic(target / name, lambda tmp, name=name: shutil.copyfile(run_dir / name, tmp))
    return target


def archive(sweep_dir: Path, dest: Path) -> list[Path]:
    """Copy the committable files of `sweep_dir` into `dest`; returns the archived run directories."""
    sweep_dir, dest = Path(sweep_dir), Path(dest)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep directory {str(sweep_dir)!r} does not exist")
    runs = _run_dirs(sweep_dir)
    if not runs:
        raise FileNotFoundError(f"no run directories in {str(sweep_dir)!r}")
    fingerprint = read_sweep_record(sweep_dir).get("fingerprint")
    check_destination(sweep_dir, dest, {run.relative_to(sweep_dir) for run in runs}, fingerprint)
    copy_records(sweep_dir, dest)
    archived_dirs = []
    for run_dir in runs:
        target = dest / run_dir.relative_to(sweep_dir)
        if not rundirs.run_state(run_dir).done and rundirs.run_state(target).done:
            continue  # finished in the archive, unfinished here (e.g. a fresh clone's partial rerun)
        archived_dirs.append(archive_run(sweep_dir, run_dir, dest))
    return sorted({*archived_dirs, *(p for p in _run_dirs(dest))})


def archived(run: Run, sweep_dir: Path, dest: Path) -> Run:
    """`run` as its copy in the archive `dest` of the sweep directory `sweep_dir`."""
    return replace(run, run_dir=Path(dest) / run.run_dir.relative_to(sweep_dir))


def served_from_archive(runs: list[Run], sweep_dir: Path, dest: Path) -> list[Run]:
    """The runs not done in `sweep_dir` whose copy in the archive `dest` is done (finished or
    diverged): a sweep archiving into `dest` skips them, so a fresh checkout of the archive
    resumes the sweep. A finished parent that a chained run still to run needs is left out: its
    exported student is not archived, so it runs again (seeded; its archived record is kept)."""
    served = {
        run.run_dir
        for run in runs
        if not rundirs.run_state(run).done and rundirs.run_state(archived(run, sweep_dir, dest)).done
    }

    def rerun(parent: Path) -> bool:  # a diverged parent would only fail its chained run again
        return rundirs.run_state(Path(dest) / parent.relative_to(sweep_dir)).finished

    while needed := {
        run.after
        for run in runs
        if run.after in served
        and run.run_dir not in served
        and not rundirs.run_state(run).done
        and rerun(run.after)
    }:
        served -= needed
    return [run for run in runs if run.run_dir in served]

"""`distill sweep SPEC`: run every fit of a sweep spec, resumably (spec format: `distill.experiments.run.spec`).

Finished (and diverged) runs are skipped; a killed run resumes from its `checkpoints/last.ckpt` or restarts
afresh (see `distill.experiments.run.rundirs`). Each fit runs as a subprocess with its output in
`<run_dir>/fit.log` and `DISTILL_ROLLOUT_CACHE=<out>/rollout_cache`, so teacher rollouts are
shared across runs. A failed run is reported and the sweep goes on; the exit code is 1 if any
run failed. In a staged spec a chained run waits until its parent has finished; when the parent
fails (or is not part of this invocation and unfinished), the chained run fails with exit code -2.

Unless the spec says `references: false`, the sweep also tests, once, the untouched student
(`references/start`) and the teacher in the student's place (`references/teacher`) with
`distill test`, as every run's final student is tested (`distill.experiments.run.references`); they
run first, are listed by `--dry-run`, skipped once finished, and are not counted as runs of the grid.

`--devices 0,1,2,3 --jobs 2` gives each running fit its own GPUs: the list is cut into `jobs` equal
groups (here 0,1 and 2,3) and a fit starts with `CUDA_VISIBLE_DEVICES` set to a group no other
running fit holds; its config's `trainer.devices` should match the group's size.

`--archive DEST` keeps the committable part of each run in DEST as soon as it finishes
(`distill.experiments.run.archive`; runs finished before are archived at the start) and skips the runs
DEST already holds finished. Commit DEST as the sweep goes, and a sweep cut short resumes from a
fresh checkout, where the sweep directory (checkpoints, gigabytes) is gone; `distill report DEST`
reads the archive.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from distill.experiments.run import rundirs
from distill.experiments.run import spec as spec_module
from distill.experiments.run.archive import (
    ArchiveError,
    archived,
    check_destination,
    copy_records,
    served_from_archive,
)
from distill.experiments.run.fit_env import (  # noqa: F401 (ROLLOUT_CACHE_ENV re-exported)
    ROLLOUT_CACHE_ENV,
    check_named_models,
    child_env,
    device_groups,
)
from distill.experiments.run.references import reference_runs
from distill.experiments.run.slurm import add_slurm_arguments, slurm_options, write_slurm
from distill.experiments.run.spec import Run, SpecError, SweepSpec, expand, load_spec
from distill.experiments.run.sweep_record import spec_fingerprint, write_sweep_record
from distill.experiments.run.tally import Progress, SweepResult, Tally, keep_in_archive
from distill.rundir import RunDirError, RunLock

POLL_S = 0.1
STATUS_FILE = "status.json"  # <out>/status.json: the sweep's progress and time left, for other shells


def _kind(run: Run) -> str:
    return "reference" if run.reference else "fit"


def _launch(
    spec: SweepSpec,
    run: Run,
    fit_prefix: Sequence[str],
    test_prefix: Sequence[str] | None,
    env: dict[str, str],
) -> tuple[subprocess.Popen, Path]:
    """Start one run (resuming or afresh) with its output in its log; raises RunDirError when its
    run directory is held by another process."""
    cmd = rundirs.command(run, spec.base, fit_prefix, test_prefix)
    state = rundirs.prepare_run_dir(run, spec.name)
    log_path = run.run_dir / (rundirs.TEST_LOG if run.reference else rundirs.FIT_LOG)
    with open(log_path, "a" if state == "resume" else "w") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, log_path


def run_sweep(
    spec: SweepSpec,
    runs: list[Run],
    jobs: int = 1,
    fit_prefix: Sequence[str] = rundirs.DEFAULT_FIT_PREFIX,
    stream: TextIO | None = None,
    test_prefix: Sequence[str] | None = None,
    devices: list[str] | None = None,
    archive_to: Path | None = None,
) -> SweepResult:
    """Run the unfinished `runs` (fits and references), at most `jobs` at once; returns what was
    skipped, finished, failed. `test_prefix` starts a reference's `distill test` (default: derived
    from `fit_prefix`, see `rundirs.derive_test_prefix`). `devices` (`device_groups`, one per job):
    each running fit holds one as its `CUDA_VISIBLE_DEVICES`. `archive_to`: the `--archive`
    directory (finished runs are copied there; runs finished there are skipped)."""
    stream = sys.stdout if stream is None else stream
    result = SweepResult()
    write_sweep_record(spec, runs)
    env = child_env(spec.out, jobs)
    tally = Tally(result, Progress(len(runs), stream, jobs, spec.out / STATUS_FILE))
    progress = tally.progress
    served: set[Path] = set()
    if archive_to is not None:
        copy_records(spec.out, archive_to)
        served = {run.run_dir for run in served_from_archive(runs, spec.out, archive_to)}
        tally.keep = lambda run: keep_in_archive(spec, run, archive_to, progress)
    pending = []
    for run in runs:
        if rundirs.run_state(run).done:
            result.skipped.append(run.name)
            if archive_to is not None and not rundirs.run_state(archived(run, spec.out, archive_to)).done:
                tally.keep(run)
        elif run.run_dir in served:
            result.skipped.append(run.name)
        else:
            pending.append(run)
    progress.done = len(result.skipped)
    progress.pending_kinds = [_kind(run) for run in pending]
    if result.skipped:
        where = f" ({len(served)} of them in {archive_to})" if served else ""
        progress.message(f"[sweep] {len(result.skipped)} run(s) already finished{where}, skipped")
    free = list(devices or [])  # GPU groups no running fit holds
    active: dict[str, tuple[subprocess.Popen, Run, Path, str | None]] = {}
    try:
        while pending or active:
            waiting = {r.run_dir for r in pending} | {r.run_dir for _, r, _, _ in active.values()}
            for run in list(pending):  # spec order; a chained run only once its parent finished
                if len(active) >= jobs:
                    break
                if run.after is not None and not rundirs.run_state(run.after).finished:
                    if run.after in waiting - tally.lost:
                        continue
                    pending.remove(run)
                    message = f"[sweep] FAILED {run.name} (its parent {run.after} did not finish)"
                    tally.fail(run, -2, run.after / rundirs.FIT_LOG, message)
                    continue
                pending.remove(run)
                gpus = free.pop(0) if free else None
                run_env = env if gpus is None else {**env, "CUDA_VISIBLE_DEVICES": gpus}
                try:
                    proc, log_path = _launch(spec, run, fit_prefix, test_prefix, run_env)
                except RunDirError as err:  # held by another process: left as it is
                    free += [gpus] if gpus is not None else []
                    tally.fail(run, -3, run.run_dir / rundirs.FIT_LOG, f"[sweep] FAILED {run.name}: {err}")
                    continue
                active[run.name] = (proc, run, log_path, gpus)
                progress.begin(run.name, _kind(run))
            time.sleep(POLL_S)
            progress.tick()
            for name, (proc, run, log_path, gpus) in list(active.items()):
                code = proc.poll()
                if code is not None:
                    del active[name]
                    free += [gpus] if gpus is not None else []
                    tally.exited(run, code, log_path)
    except BaseException:
        for proc, *_ in active.values():  # only our own children
            proc.terminate()
        for proc, *_ in active.values():
            proc.wait()
        raise
    finally:
        progress.close()
    return result


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distill sweep",
        description=__doc__,
        epilog="Sweep spec format (distill.experiments.run.spec):\n" + (spec_module.__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "spec", type=Path, help="sweep spec YAML (format: pydoc distill.experiments.run.spec)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print 'STATE NAME COMMAND' per run; run nothing"
    )
    parser.add_argument("--jobs", type=int, default=1, help="fits to run at once (default 1)")
    parser.add_argument(
        "--devices",
        help="GPU ids to share out, e.g. 0,1,2,3: each running fit gets len/jobs of them as its "
        "CUDA_VISIBLE_DEVICES (their number must be a multiple of --jobs)",
    )
    parser.add_argument("--out", type=Path, help="output directory (default: the spec's 'out')")
    parser.add_argument(
        "--archive",
        type=Path,
        metavar="DEST",
        help="copy each finished run's committable files into DEST (as `distill report --archive`) "
        "and skip the runs DEST holds finished: commit DEST, and the sweep resumes from a fresh checkout",
    )
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this run (repeatable)")
    parser.add_argument(
        "--fit-prefix",
        help="command that starts one fit, before '--config ...' "
        "(default: '<this python> -m distill.cli fit'; e.g. 'torchrun --nproc_per_node 4 -m distill.cli fit')",
    )
    parser.add_argument(
        "--test-prefix",
        help="command that starts the references' `distill test`, before '--config ...' "
        "(default: the fit prefix with its final 'fit' replaced by 'test')",
    )
    slurm = parser.add_argument_group("SLURM (with --emit-slurm; these override the spec's 'slurm:' section)")
    slurm.add_argument(
        "--emit-slurm", type=Path, metavar="FILE", help="write a job-array sbatch script; run nothing"
    )
    add_slurm_arguments(slurm)
    return parser


def _emit_slurm(args, spec: SweepSpec, runs: list[Run], fit_prefix, test_prefix) -> int:
    """`--emit-slurm`: write the job-array script; `fit_prefix`/`test_prefix`: None unless custom."""
    if spec.stages:
        print(
            "distill sweep: --emit-slurm does not handle chained stages (array tasks cannot wait for "
            "their parents); run `distill sweep SPEC --jobs N` inside one allocation instead",
            file=sys.stderr,
        )
        return 2
    try:
        options = slurm_options(spec.slurm, args)
        script, commands = write_slurm(spec, runs, args.emit_slurm, options, fit_prefix, test_prefix)
    except ValueError as err:
        print(f"distill sweep: {err}", file=sys.stderr)
        return 2
    print(f"wrote {script} ({len(runs)} array tasks) and {commands}; submit with: sbatch {script}")
    return 0


def _dry_run(spec: SweepSpec, runs: list[Run], fit_prefix, test_prefix, archive_to=None) -> int:
    """`--dry-run`: each run's state and command, then the counts ('done' counts the runs
    finished in the `--archive` directory too)."""
    states = {kind: {"done": 0, "resume": 0, "todo": 0} for kind in ("runs", "references")}
    served = {r.run_dir for r in served_from_archive(runs, spec.out, archive_to)} if archive_to else set()
    try:
        for run in runs:
            state = "done" if run.run_dir in served else rundirs.run_state(run).next
            states["references" if run.reference else "runs"][state] += 1
            cmd = rundirs.command(run, spec.base, fit_prefix, test_prefix)
            print(f"{state:<6} {run.name}  {shlex.join(cmd)}")
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `distill sweep SPEC --dry-run | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    grid, ref = states["runs"], states["references"]
    summary = (
        f"{sum(grid.values())} runs: {grid['done']} finished (skipped), {grid['resume']} to resume, "
        f"{grid['todo']} to start"
    )
    if sum(ref.values()):
        summary += (
            f"; {sum(ref.values())} references: {ref['done']} finished (skipped), {ref['todo']} to start"
        )
    print(f"{summary}; out: {spec.out}", file=sys.stderr)
    return 0


def _run(
    spec: SweepSpec, runs: list[Run], jobs: int, fit_prefix, test_prefix, devices=None, archive_to=None
) -> int:
    """Run the sweep under its output directory's lock, stopping the fits on SIGTERM; a summary."""
    try:  # one sweep per output directory at a time
        lock = RunLock(spec.out, what="sweep output directory").acquire()
    except RunDirError as err:
        print(f"distill sweep: {err}", file=sys.stderr)
        return 2
    # A scheduler's SIGTERM (e.g. a time limit) should stop our fits too, not orphan them.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        result = run_sweep(
            spec, runs, jobs, fit_prefix, test_prefix=test_prefix, devices=devices, archive_to=archive_to
        )
    except KeyboardInterrupt:
        print(
            "\n[sweep] interrupted; running fits stopped. Rerun the same command to resume.", file=sys.stderr
        )
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        lock.release()
    ref_names = {run.name for run in runs if run.reference}
    failed = [name for name, _, _ in result.failed]
    counts = {
        is_ref: [
            len([n for n in names if (n in ref_names) == is_ref])
            for names in (result.finished, result.skipped, failed)
        ]
        for is_ref in (False, True)
    }
    summary = "{} finished now, {} skipped (finished before), {} failed".format(*counts[False])
    if ref_names:  # references are not runs of the grid: counted apart
        summary += "; references: {} finished now, {} skipped, {} failed".format(*counts[True])
    print(f"[sweep] {spec.name}: {summary}; out: {spec.out}")
    for name, code, log in result.failed:
        print(f"[sweep]   failed: {name} (exit {code}); log: {log}")
    return 1 if result.failed else 0


def main(
    argv: list[str] | None = None,
    fit_prefix: Sequence[str] | None = None,
    test_prefix: Sequence[str] | None = None,
) -> int:
    """Entry point of `distill sweep`; `fit_prefix` and `test_prefix` (tests) replace the commands
    that start a fit and a reference's test."""
    args = _parser().parse_args(argv)
    if args.jobs < 1:
        print(f"distill sweep: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    try:
        devices = device_groups(args.devices, args.jobs) if args.devices else None
    except ValueError as err:
        print(f"distill sweep: {err}", file=sys.stderr)
        return 2
    try:
        spec = load_spec(args.spec, out=args.out)
        refs, notes = reference_runs(spec)
        runs = expand(spec)
    except SpecError as err:
        print(f"distill sweep: {args.spec}: {err}", file=sys.stderr)
        return 2
    custom_prefix = fit_prefix is not None or args.fit_prefix is not None
    if fit_prefix is None:
        fit_prefix = shlex.split(args.fit_prefix) if args.fit_prefix else rundirs.DEFAULT_FIT_PREFIX
    custom_test = test_prefix is not None or args.test_prefix is not None
    if test_prefix is None and args.test_prefix:
        test_prefix = shlex.split(args.test_prefix)
    runs = refs + runs  # references first: the report can compare with them from the first run on
    if args.archive is not None:  # before any compute, against every run of the spec
        try:
            wanted = {run.run_dir.relative_to(spec.out) for run in runs}
            check_destination(spec.out, args.archive, wanted, spec_fingerprint(spec))
        except ArchiveError as err:
            print(f"distill sweep: {err}", file=sys.stderr)
            return 2
    if args.only:
        by_name = {run.name: run for run in runs}
        missing = [name for name in args.only if name not in by_name]
        if missing:
            print(f"distill sweep: --only: no run named {', '.join(missing)} in {args.spec}", file=sys.stderr)
            return 2
        runs = [by_name[name] for name in args.only]
    else:
        for note in notes:
            print(f"[sweep] {note}", file=sys.stderr)
    try:  # a reference's command needs a test prefix: fail now, not after hours of fits
        for run in runs:
            if run.reference:
                rundirs.command(run, spec.base, fit_prefix, test_prefix)
    except ValueError as err:
        print(f"distill sweep: {err}", file=sys.stderr)
        return 2
    if not args.emit_slurm and not args.dry_run:  # the jobs of a cluster may see another cache
        try:
            check_named_models(runs, spec.base)
        except (FileNotFoundError, ValueError) as err:
            print(f"distill sweep: {args.spec}: {err}", file=sys.stderr)
            return 2
    if args.emit_slurm:
        if args.archive is not None:
            print(
                "distill sweep: --archive works with the sweep runner only, not --emit-slurm", file=sys.stderr
            )
            return 2
        prefix = list(fit_prefix) if custom_prefix else None
        tests = list(test_prefix) if custom_test and test_prefix is not None else None
        return _emit_slurm(args, spec, runs, prefix, tests)
    if args.dry_run:
        return _dry_run(spec, runs, fit_prefix, test_prefix, args.archive)
    return _run(spec, runs, args.jobs, fit_prefix, test_prefix, devices, args.archive)

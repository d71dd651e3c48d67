"""`distill report` on a synthetic sweep with planted effects (no training)."""

from __future__ import annotations

import csv
import itertools
import json
import math
import re

import numpy as np
import pytest
import yaml

from distill.experiments.report.report import importance, main
from distill.experiments.run.records import load_records
from distill.experiments.run.spec import run_name

DIVS = ["forward_kl", "reverse_kl", "jsd"]
BASE_ACC = {"forward_kl": 0.2, "reverse_kl": 0.5, "jsd": 0.35}
MIXES, LRS, SEEDS = [0, 0.5, 1], [1e-4, 1e-3], [0, 1, 2]


def _metrics(div, mix, lr, rng):
    acc = BASE_ACC[div] + 0.02 * mix + 0.01 * rng.normal()
    return {
        "test/countdown3/accuracy": acc,  # planted: divergence
        "test/countdown4/accuracy": acc / 2,
        "test/countdown3/pass@4": 0.3 + 0.4 * mix + 0.01 * rng.normal(),  # planted: mix
        "forgetting/mean_delta": -0.3 * math.log10(lr / 1e-4) + 0.01 * rng.normal(),  # planted: lr
        "sparsity/overall": 0.9 - 0.5 * (lr == 1e-3) + 0.01 * rng.normal(),  # planted: lr
        # planted: bounded for forward KL whatever the mix, growing with the mix for reverse KL
        "grad/logit_sq_norm": (1.0 if div == "forward_kl" else 1.0 + 3.0 * mix) + 0.01 * rng.normal(),
        "cost/flops": 1e12 * (1 + mix),
        "cost/wall_s": 10.0 + rng.random(),
        "task/constant": 1.0,
    }


@pytest.fixture
def sweep(tmp_path):
    """A 3 x 3 x 2 x 3 sweep directory; one run is unfinished, one has only overrides.yaml."""
    rng = np.random.default_rng(0)
    root = tmp_path / "sweep"
    root.mkdir()
    axes = {"mix": MIXES, "divergence": DIVS, "lr": LRS, "seed": SEEDS}
    (root / "sweep.json").write_text(json.dumps({"name": "synthetic", "axes": axes}))
    (root / "rollout_cache").mkdir()
    for i, (mix, div, lr, seed) in enumerate(itertools.product(MIXES, DIVS, LRS, SEEDS)):
        settings = {"mix": mix, "divergence": div, "lr": lr, "seed": seed}
        run_dir = root / run_name(settings)
        run_dir.mkdir()
        metrics = {"status": "finished", "metrics": _metrics(div, mix, lr, rng), "settings": {}}
        if i == 5:  # a killed run: its truncated metrics.json must not count
            (run_dir / "metrics.json").write_text('{"status": "fini')
        else:
            (run_dir / "metrics.json").write_text(json.dumps(metrics))
        if i == 7:  # settings only in overrides.yaml (full config paths and class path)
            class_path = {"forward_kl": "ForwardKL", "reverse_kl": "ReverseKL", "jsd": "GeneralizedJSD"}[div]
            overrides = {
                "data": {"mix": mix},
                "model": {
                    "divergence": {"class_path": f"distill.losses.{class_path}"},
                    "optimizer": {"init_args": {"lr": lr}},
                },
                "seed_everything": seed,
            }
            (run_dir / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        else:
            (run_dir / "settings.json").write_text(json.dumps({"settings": settings}))
    return root


def test_records_read_settings_from_files_not_names(sweep):
    records = load_records(sweep)
    assert len(records) == 54 and sum(not r.finished for r in records) == 1
    fallback = [r for r in records if not (r.run_dir / "settings.json").exists()]
    assert len(fallback) == 1 and set(fallback[0].settings) == {"mix", "divergence", "lr", "seed"}
    assert fallback[0].settings["divergence"] in DIVS


def test_factor_analysis_names_the_planted_knob(sweep):
    done = [r for r in load_records(sweep) if r.finished]
    outcomes = [
        "test/countdown3/accuracy",
        "test/countdown3/pass@4",
        "forgetting/mean_delta",
        "sparsity/overall",
    ]
    results = {
        imp.outcome: imp for imp in importance(done, outcomes, ["mix", "divergence", "lr"], n_boot=200)
    }
    planted = {
        "test/countdown3/accuracy": "divergence",
        "test/countdown3/pass@4": "mix",
        "forgetting/mean_delta": "lr",
        "sparsity/overall": "lr",
    }
    for outcome, knob in planted.items():
        imp = results[outcome]
        assert imp.largest() == knob and imp.factors[knob].estimate > 0.9, (outcome, imp)
        others = [s.high for k, s in imp.factors.items() if k != knob]
        assert imp.factors[knob].low > max(others)  # separated by the intervals too
        assert imp.n_runs == 53


def test_report_writes_csv_markdown_and_plots(sweep, capsys):
    assert main([str(sweep), "--n-boot", "100"]) == 0
    out = sweep / "report"
    assert "wrote" in capsys.readouterr().out
    with open(out / "runs.csv") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    assert header[:6] == ["run", "finished", "mix", "divergence", "lr", "seed"]  # spec order
    assert header[6:10] == [
        "test/countdown3/accuracy",
        "test/countdown4/accuracy",
        "test/countdown3/pass@4",
        "forgetting/mean_delta",
    ]
    assert len(rows) == 55 and sum(row[1] == "false" for row in rows[1:]) == 1
    by_name = {row[0]: dict(zip(header, row)) for row in rows[1:]}
    one = by_name["divergence=jsd,lr=1e-3,mix=0.5,seed=2"]
    assert one["lr"] == "1e-3" and one["divergence"] == "jsd"
    stored = json.loads((sweep / one["run"] / "metrics.json").read_text())["metrics"]
    assert float(one["forgetting/mean_delta"]) == stored["forgetting/mean_delta"]

    text = (out / "report.md").read_text()
    for heading in (
        "## Accuracy by divergence × mix",
        "### test/countdown4/accuracy",
        "## Coverage",
        "## Effects",
        "## Logit-gradient squared norm per token by divergence × mix",
        "## Cost",
    ):
        assert heading in text
    effects = {
        div: re.search(
            rf"\| grad/logit_sq_norm \| mix=0 − mix=1 \(on − off-policy\) \| divergence={div} \| ([^|]+) \| ([^|]+) \| ([^|]+) \|",
            text,
        )
        for div in ("forward_kl", "reverse_kl")
    }
    assert float(effects["reverse_kl"].group(1)) == pytest.approx(-3.0, abs=0.05) and "✱" in effects[
        "reverse_kl"
    ].group(3)
    assert abs(float(effects["forward_kl"].group(1))) < 0.05
    assert re.search(
        r"\| test/countdown3/accuracy \| mix=0 − mix=1 \(on − off-policy\) \| divergence=forward_kl \| [+-]\d+\.\d pp \|",
        text,
    )
    assert "pooled over lr" in text and "| lr=1e-4 |" in text
    assert "- test/countdown3/accuracy: largest main effect **divergence** (99% of" in text
    assert "- forgetting/mean_delta: largest main effect **lr** (100% of" in text
    assert "- test/countdown3/pass@4: largest main effect **mix** (100% of" in text
    assert "| seed | 0, 1, 2 | replicate |" in text and "Left out of every table and figure" in text
    assert ": malformed metrics.json" in text
    assert "task/constant" not in text.split("## Which knob matters")[1].split("## Cost")[0]
    # an accuracy cell against an independent mean/std
    cell = [
        r.metrics["test/countdown3/accuracy"]
        for r in load_records(sweep)
        if r.finished and r.settings["divergence"] == "jsd" and r.settings["mix"] == 0.5
    ]
    expected = f"{100 * np.mean(cell):.1f} ± {100 * np.std(cell, ddof=1):.1f} ({len(cell)})"  # percent
    assert re.search(rf"\| jsd \|[^\n]*{re.escape(expected)}", text)
    # cost per accuracy point: FLOPs / (100 x accuracy) in the forward_kl, mix=0 cell
    cell = [
        r.metrics
        for r in load_records(sweep)
        if r.finished and r.settings["divergence"] == "forward_kl" and r.settings["mix"] == 0
    ]
    per_point = np.mean([m["cost/flops"] for m in cell]) / (
        100 * np.mean([m["test/countdown3/accuracy"] for m in cell])
    )
    acc = 100 * np.mean([m["test/countdown3/accuracy"] for m in cell])
    row = re.search(r"\| divergence=forward_kl, mix=0 \|[^\n]*", text.split("## Cost", 1)[1]).group(0)
    assert row.endswith(
        f"| {acc:.1f} | {per_point:.2e} | {np.mean([m['cost/wall_s'] for m in cell]) / acc:.1f} |"
    )

    plots = sorted(p.name for p in (out / "plots").iterdir())
    assert "heatmap_test_countdown3_accuracy.png" in plots and "vs_lr.png" in plots
    assert "vs_mix_test_countdown4_accuracy.png" in plots and "training_curves.png" not in plots
    assert "gradient_vs_mix.png" in plots
    for name in plots:
        data = (out / "plots" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        assert f"](plots/{name})" in text
    assert "training curves skipped" in text


def test_training_curves_from_tensorboard_events(sweep, tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    for run_dir in sorted(p for p in sweep.iterdir() if p.name.startswith("divergence="))[:4]:
        writer = SummaryWriter(str(run_dir / "tensorboard" / "version_0"))
        for step in range(0, 50, 5):
            writer.add_scalar("train/forward_kl", 2.0 / (1 + step), step)
            writer.add_scalar("train/reverse_kl", 1.0 / (1 + step), step)
        writer.close()
    from distill.experiments.run.records import read_curves

    steps, values = read_curves(run_dir)["train/forward_kl"]
    assert steps == list(range(0, 50, 5)) and values[2] == pytest.approx(2.0 / 11)
    assert main([str(sweep), "--out", str(tmp_path / "rep"), "--n-boot", "50"]) == 0
    png = (tmp_path / "rep" / "plots" / "training_curves.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 10_000
    assert "training curves skipped" not in (tmp_path / "rep" / "report.md").read_text()


def test_report_errors_are_clear(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([str(tmp_path)]) == 2
    assert "no run directories" in capsys.readouterr().err


def test_tables_fall_back_to_the_knobs_that_vary(sweep, tmp_path):
    import shutil

    for run_dir in sweep.iterdir():
        if run_dir.name.startswith("divergence=") and not run_dir.name.startswith("divergence=jsd,"):
            shutil.rmtree(run_dir)
    # left: divergence=jsd only (a constant); mix and lr vary; 3 seeds
    assert main([str(sweep), "--out", str(tmp_path / "r"), "--n-boot", "50"]) == 0
    text = (tmp_path / "r" / "report.md").read_text()
    assert "| divergence | jsd | constant |" in text
    assert "## Accuracy by mix × lr" in text and "| mix \\ lr | lr=1e-4 | lr=1e-3 |" in text
    assert "pooled over" not in text.split("## Coverage")[0]
    assert (tmp_path / "r" / "plots" / "heatmap_test_countdown3_accuracy.png").stat().st_size > 10_000
    assert "| outcome | runs | mix | lr | interactions | seeds (residual) |" in text


def test_archive_keeps_the_committable_files_and_regenerates_the_report(sweep, tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    run_dir = sorted(p for p in sweep.iterdir() if p.name.startswith("divergence="))[0]
    writer = SummaryWriter(str(run_dir / "tensorboard" / "version_0"))
    for step in range(0, 30, 10):
        writer.add_scalar("train/forward_kl", 1.0 + step, step)
        writer.add_scalar("train/grad_norm", 5.0, step)  # not a curve tag: not archived
    writer.close()
    (run_dir / "config.yaml").write_text("trainer: {max_steps: 3}\n")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"x" * 100)
    (run_dir / "theta0.safetensors").write_bytes(b"x" * 100)

    dest = tmp_path / "results" / "synthetic"
    assert main([str(sweep), "--archive", str(dest), "--n-boot", "50"]) == 0
    assert "archived 54 runs" in capsys.readouterr().out
    archived = dest / run_dir.name
    assert sorted(p.name for p in archived.iterdir()) == [
        "config.yaml",
        "curves.csv",
        "metrics.json",
        "settings.json",
    ]
    assert (archived / "curves.csv").read_text().splitlines() == [
        "tag,step,value",
        "train/forward_kl,0,1.0",
        "train/forward_kl,10,11.0",
        "train/forward_kl,20,21.0",
    ]
    assert not (dest / "rollout_cache").exists() and (dest / "sweep.json").is_file()
    # The report from the archive alone equals the one from the sweep itself (event files and all),
    # but for line 3, which names the directory read.
    assert main([str(sweep), "--out", str(tmp_path / "from_sweep"), "--n-boot", "50"]) == 0
    from_sweep = (tmp_path / "from_sweep" / "report.md").read_text().splitlines()
    from_archive = (dest / "report" / "report.md").read_text().splitlines()
    assert "![training_curves](plots/training_curves.png)" in from_archive
    assert from_archive[:2] + from_archive[3:] == from_sweep[:2] + from_sweep[3:]
    assert (dest / "report" / "plots" / "training_curves.png").stat().st_size > 10_000

    # Archiving an archive keeps the curves; archiving again drops files the source no longer has.
    assert main([str(dest), "--archive", str(tmp_path / "again"), "--no-plots"]) == 0
    assert (tmp_path / "again" / run_dir.name / "curves.csv").read_text() == (
        archived / "curves.csv"
    ).read_text()
    (run_dir / "config.yaml").unlink()
    assert main([str(sweep), "--archive", str(dest), "--no-plots"]) == 0
    assert not (archived / "config.yaml").exists() and (archived / "metrics.json").is_file()

    # Runs that are not in the sweep are never mixed into its archive.
    (dest / "divergence=other,seed=0").mkdir()
    (dest / "divergence=other,seed=0" / "metrics.json").write_text("{}")
    capsys.readouterr()
    assert main([str(sweep), "--archive", str(dest)]) == 2
    assert "holds 1 runs that are not in" in capsys.readouterr().err
    assert main([str(sweep), "--archive", str(sweep / "results")]) == 2
    assert "must lie outside the sweep directory" in capsys.readouterr().err


def test_within_divergence_importance_names_the_planted_knob(sweep, tmp_path):
    assert main([str(sweep), "--out", str(tmp_path / "rep"), "--n-boot", "50", "--no-plots"]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    section = text.split("## Which knob matters within each divergence", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0] in DIVS:
            rows[(cells[0], cells[1])] = cells
    # Header: divergence, outcome, runs, mix, lr, interactions, seeds. Within every divergence
    # pass@4 is planted on mix and forgetting on lr; accuracy varies only by noise and mix.
    for div in DIVS:
        assert rows[(div, "test/countdown3/pass@4")][3].startswith("**")
        assert rows[(div, "forgetting/mean_delta")][4].startswith("**")
        assert float(rows[(div, "sparsity/overall")][4].strip("*").split()[0]) > 0.9
    assert all(int(r[2]) in (17, 18) for r in rows.values())  # 18 runs per divergence, one unfinished


def test_importance_section_names_its_resampling():
    from distill.experiments.report.report import _importance_section
    from distill.experiments.stats.analysis import Importance, Share

    def imp(resampling):
        share = Share(0.04, 0.01, 0.06)
        return Importance("acc", 8, {"lr": Share(0.5, 0.4, 0.6)}, Share(0.1, 0.0, 0.2), share, resampling)

    text = "\n".join(_importance_section([imp("within-cell residuals")], ["lr"]))
    assert "within-cell residuals resampled" in text and "seed noise cannot be told apart" not in text
    assert "seed noise cannot be told apart" in "\n".join(_importance_section([imp("runs")], ["lr"]))


def test_gradient_plot_has_a_column_per_learning_rate_so_bars_are_seed_spread(tmp_path, monkeypatch):
    from distill.experiments.report import plots
    from distill.experiments.run.records import RunRecord

    metric = "grad/logit_sq_norm"
    records = [
        RunRecord(
            f"r{i}", tmp_path, True, {"mix": m, "divergence": d, "lr": lr, "seed": s}, {metric: lr * (1 + m)}
        )
        for i, (m, d, lr, s) in enumerate(
            (m, d, lr, s)
            for m in (0, 1)
            for d in ("forward_kl", "reverse_kl")
            for lr in (1e-4, 1e-3)
            for s in (0, 1)
        )
    ]
    drawn = {}

    def keep(fig, path):
        drawn[path.name] = [
            (ax.get_title(), [tuple(line.get_ydata()) for line in ax.get_lines()]) for ax in fig.axes
        ]
        return path

    monkeypatch.setattr(plots, "_save", keep)
    lines = ("divergence", ["forward_kl", "reverse_kl"])
    plots.against_knob(records, [metric], ("mix", [0, 1]), lines, tmp_path, "g", panels=("lr", [1e-4, 1e-3]))
    (title_a, lines_a), (title_b, lines_b) = drawn["g.png"]
    assert title_a == f"{metric}, lr=1e-4" and title_b == f"{metric}, lr=1e-3"
    # each panel holds its own lr's runs only: the seeds agree, so the means are exact
    assert lines_a[0] == pytest.approx((1e-4, 2e-4)) and lines_b[0] == pytest.approx((1e-3, 2e-3))


def test_the_archive_keeps_the_style_course_and_the_report_derives_the_adoption_step(sweep, tmp_path):
    """Adopted: the student writes the style at least half as often as the teacher does (the
    teacher's own share, or 1.0 for runs that did not record it: v2's rule of a fixed 0.5)."""
    from torch.utils.tensorboard import SummaryWriter

    from distill.experiments.run.records import STYLE_ADOPTION, load_records

    finished = [p for p in sorted(sweep.iterdir()) if p.name.startswith("divergence=")]
    adopted, never, graded = [p for p in finished if (p / "metrics.json").read_text().endswith("}")][:3]
    greedy, sampled = "style/teacher_style_share", "style/teacher_style_share_sampled"
    courses = {
        adopted: ({greedy: (0.0, 0.2, 0.6, 1.0)}, {}),
        never: ({greedy: (0.0, 0.1, 0.2, 0.3)}, {}),
        # a teacher that writes its style 44 % of the time: adopted at 0.22, on the sampled share
        graded: (
            {greedy: (0.0, 0.0, 0.0, 0.3), sampled: (0.0, 0.1, 0.25, 0.4)},  # greedy: step 30
            {"style/teacher_own_share": 0.4, "style/teacher_own_share_sampled": 0.44},
        ),
    }
    for run_dir, (curves, own) in courses.items():
        writer = SummaryWriter(str(run_dir / "tensorboard" / "version_0"))
        for tag, shares in curves.items():
            for step, share in zip(range(0, 40, 10), shares):
                writer.add_scalar(tag, share, step)
        writer.close()
        data = json.loads((run_dir / "metrics.json").read_text())
        data["metrics"].update({tag: shares[-1] for tag, shares in curves.items()}, **own)
        (run_dir / "metrics.json").write_text(json.dumps(data))
    dest = tmp_path / "archive"
    assert main([str(sweep), "--archive", str(dest), "--no-plots"]) == 0
    rows = (dest / adopted.name / "curves.csv").read_text().splitlines()
    assert "style/teacher_style_share,20,0.6" in [r[: len("style/teacher_style_share,20,0.6")] for r in rows]
    records = {r.name: r for r in load_records(dest)}
    assert records[adopted.name].metrics[STYLE_ADOPTION] == 20.0  # the first step at >= half of 1.0
    assert STYLE_ADOPTION not in records[never.name].metrics  # never adopted: no step, not a 0
    assert records[graded.name].metrics[STYLE_ADOPTION] == 20.0  # sampled 0.25 >= 0.44 / 2
    text = (dest / "report" / "report.md").read_text()
    assert STYLE_ADOPTION in text


def test_a_multiple_choice_accuracy_table_states_the_chance_level():
    from pathlib import Path

    from distill.experiments.report.tables import chance_line
    from distill.experiments.run.records import RunRecord

    def record(i, metrics):
        return RunRecord(f"r{i}", Path(f"r{i}"), True, {}, metrics)

    mc = [record(i, {"test/tinysci/accuracy": 0.5, "test/tinysci/chance": 0.25}) for i in range(2)]
    assert chance_line(mc, "test/tinysci/accuracy") == [
        "Chance (a uniform guess among the options): 25.0 %.",
        "",
    ]
    mixed = [*mc, record(3, {"test/tinysci/accuracy": 0.4, "test/tinysci/chance": 0.2})]
    assert chance_line(mixed, "test/tinysci/accuracy")[0].endswith(": 20.0 % to 25.0 %.")
    assert chance_line([record(4, {"test/countdown3/accuracy": 0.3})], "test/countdown3/accuracy") == []
    assert chance_line(mc, "test/tinysci/pass@1") == []


def test_the_headline_test_set_is_the_trained_task_outside_countdown(tmp_path):
    from distill.experiments.run.records import RunRecord, metric_names, trained_task

    def records(task):
        out = []
        for i in range(2):
            run = tmp_path / task.replace("/", "_") / f"r{i}"
            run.mkdir(parents=True)
            (run / "config.yaml").write_text(yaml.safe_dump({"data": {"task": task}}))
            metrics = {f"test/{s}/accuracy": 0.1 for s in ("countdown3", "countdown4", "tinysci")}
            out.append(RunRecord(f"r{i}", run, True, {}, metrics))
        return out

    sci, longchain = records("tinysci"), records("longchain")
    assert trained_task(sci) == "tinysci"
    assert metric_names(sci)[:3] == [
        "test/tinysci/accuracy",
        "test/countdown3/accuracy",
        "test/countdown4/accuracy",
    ]
    # every Countdown variant keeps Countdown-3 as the headline (the long-chain robustness check too)
    assert metric_names(longchain)[0] == "test/countdown3/accuracy"
    assert trained_task([RunRecord("x", tmp_path / "none", True, {}, {})]) is None
    from distill.tasks.qa_datasets import task_name

    spec = "sciq:data/sciq_train.jsonl"
    qa = records(spec)
    for r in qa:  # a dataset spec's runs log under its task's name
        r.metrics[f"test/{task_name(spec)}/accuracy"] = 0.2
    assert metric_names(qa)[0] == f"test/{task_name(spec)}/accuracy"


@pytest.mark.parametrize(
    ("metric", "share"),
    [
        ("test/countdown3/accuracy", True),
        ("test/countdown3/pass@8", True),
        ("forgetting/mean_drop", True),
        ("style/teacher_style_share", True),
        ("style/teacher_style_share_sampled", True),  # the graded v3 measure, shown in pp like the rest
        ("style/teacher_own_share_sampled", True),
        ("style/teacher_style_share_start", True),
        ("style/teacher_style_share_steps", False),
        ("style/adoption_step", False),
        ("sparsity/relative_update_norm", False),
        ("grad/param_norm", False),
    ],
)
def test_fractions_are_shown_in_percent_and_nothing_else(metric, share):
    from distill.experiments.run.records import is_share

    assert is_share(metric) is share

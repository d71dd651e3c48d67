"""Chained stages: spec expansion, the runner's ordering, and the before/after report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from distill.experiments.report.report import build_report
from distill.experiments.run import rundirs
from distill.experiments.run.spec import SpecError, expand, parse_spec
from distill.experiments.run.sweep import main


def _staged(tmp_path, second=None, **first):
    stage1 = {"name": "distill", "base": "distill.yaml", "axes": {"mix": [0, 1], "seed": [0, 1]}} | first
    stage2 = {"name": "grpo", "after": "distill", "base": "grpo.yaml"} | (second or {})
    return parse_spec({"name": "chain", "out": "out", "stages": [stage1, stage2]}, root=tmp_path)


def test_each_run_of_a_stage_is_followed_by_a_chained_run_from_its_student(tmp_path):
    spec = _staged(tmp_path, {"overrides": {"trainer.max_steps": 7}})
    runs = expand(spec)
    assert [r.name for r in runs] == [
        *(f"distill/mix={m},seed={s}" for m in (0, 1) for s in (0, 1)),
        *(f"grpo/mix={m},seed={s}" for m in (0, 1) for s in (0, 1)),
    ]
    parent, child = runs[2], runs[6]
    assert parent.run_dir == tmp_path / "out/distill/mix=1,seed=0" and parent.after is None
    assert parent.base == [tmp_path / "distill.yaml"] and parent.stage == "distill"
    assert child.run_dir == tmp_path / "out/grpo/mix=1,seed=0" and child.after == parent.run_dir
    assert child.base == [tmp_path / "grpo.yaml"] and child.stage == "grpo"
    # Inherited: the parent's knobs as settings (labels) and its seed; not its mix override.
    assert child.settings == {"mix": 1, "seed": 0}
    assert child.overrides == {
        "trainer.max_steps": 7,
        "model.student": str(parent.run_dir / "student"),
        "seed_everything": 0,
    }
    cmd = rundirs.fit_command(child, spec.base)
    assert cmd[cmd.index("--config") + 1] == str(tmp_path / "grpo.yaml")


def test_chained_stage_axes_multiply_and_may_set_their_own_seed(tmp_path):
    spec = _staged(
        tmp_path, {"axes": {"lr": [1e-6, 3e-6]}, "overrides": {"seed_everything": 5}}, axes={"mix": [0]}
    )
    chained = [r for r in expand(spec) if r.stage == "grpo"]
    assert [r.name for r in chained] == ["grpo/lr=1e-6,mix=0", "grpo/lr=3e-6,mix=0"]
    assert chained[1].overrides["seed_everything"] == 5
    assert chained[1].overrides["model.optimizer.init_args.lr"] == 3e-6


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"stages": [{"name": "a", "base": "b.yaml", "axes": {"mix": [0]}, "after": "a"}]}, "must name an earlier stage"),
        ({"stages": []}, "'stages' must be a non-empty list"),
        ({"base": "b.yaml", "stages": [{"name": "a"}]}, "put base inside each stage"),
        ({"stages": [{"name": "a", "base": "b.yaml", "axes": {"mix": [0]}, "seeds": 1}]}, r"stages\[0\]: unknown key"),
        ({"stages": [{"name": "a", "base": "b.yaml"}]}, "stage 'a': 'axes' must be a non-empty mapping"),
        (
            {"stages": [{"name": "a", "base": "b.yaml", "axes": {"mix": [0]}}, {"name": "a", "base": "c.yaml"}]},
            "used by an earlier stage",
        ),
        (
            {"stages": [{"name": "a", "base": "b.yaml", "axes": {"seed": [0]}}, {"name": "r", "after": "a", "base": "c.yaml", "axes": {"seed": [1]}}]},
            "axis 'seed' is already a knob of its parent stage 'a'",
        ),
        (
            {"stages": [{"name": "a", "base": "b.yaml", "axes": {"mix": [0]}}, {"name": "r", "after": "a", "base": "c.yaml", "overrides": {"model.init_args.student": "x"}}]},
            "model.student is set to the parent's export",
        ),
        ({"stages": None}, "'stages' must be a non-empty list of stage mappings, got None"),
        ({"stages": {"name": "a"}}, "'stages' must be a non-empty list of stage mappings"),
        ({"stages": ["a"]}, r"'stages\[0\]' must be a mapping with keys name, base, overrides, axes, after, got 'a'"),
        ({"stages": [{"base": "b.yaml"}]}, r"'stages\[0\].name' is required: it must match"),
        ({"stages": [{"name": "a b", "base": "b.yaml"}]}, r"'stages\[0\].name' must match \[A-Za-z0-9_.-\]\+, got 'a b'"),
        ({"stages": [{"name": "a", "axes": {"mix": [0]}}]}, r"'stages\[0\].base' is required: it must be a config path"),
        ({"stages": [{"name": "a", "base": 5}]}, r"'stages\[0\].base' must be a config path or a non-empty list of paths.*got 5"),
        ({"stages": [{"name": "a", "base": [], "axes": {"mix": [0]}}]}, r"'stages\[0\].base' must be a config path.*got \[\]"),
        ({"stages": [{"name": "a", "base": "b.yaml", "axes": [0]}]}, r"'stages\[0\].axes' must be a non-empty mapping.*got \[0\]"),
        ({"stages": [{"name": "a", "base": "b.yaml", "axes": {"mix": [0]}, "overrides": "x"}]}, r"'stages\[0\].overrides' must be a mapping"),
        (
            {"stages": [{"name": "a", "base": "b.yaml", "axes": {"mix": [0]}}, {"name": "r", "base": "c.yaml", "after": 1}]},
            r"'stages\[1\].after' must name an earlier stage, got 1",
        ),
        (
            {"stages": [{"name": "a", "base": "b.yaml", "axes": {"mix": [0]}}, {"name": "r", "base": "c.yaml", "after": "null"}]},
            r"'stages\[1\].after' must name an earlier stage, got 'null'",
        ),
        (
            {"stages": [{"name": "a", "base": "b.yaml", "axes": {"mix": [0]}}, {"name": "r", "base": "c.yaml", "after": "a", "axes": {"lr": [0]}}]},
            "stage 'r': axis 'lr': value 0 must be > 0",
        ),
    ],
)  # fmt: skip
def test_bad_stages_raise_clear_errors(tmp_path, data, match):
    with pytest.raises(SpecError, match=match):
        parse_spec({"name": "chain"} | data, root=tmp_path)


def _spec_file(tmp_path: Path) -> Path:
    (tmp_path / "distill.yaml").write_text("trainer: {max_steps: 10}\ndata: {mix: 0.5}\n")
    (tmp_path / "grpo.yaml").write_text("trainer: {max_steps: 4}\ndata: {mix: 0.0}\n")
    spec = {
        "name": "chain",
        "out": str(tmp_path / "runs"),
        "stages": [
            {
                "name": "distill",
                "base": str(tmp_path / "distill.yaml"),
                "axes": {"mix": [0, 0.5], "seed": [0]},
            },
            {"name": "grpo", "after": "distill", "base": str(tmp_path / "grpo.yaml")},
        ],
    }
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _invocations(run_dir: Path) -> list[dict]:
    path = run_dir / "invocations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_runner_starts_a_chained_run_only_after_its_parent_finished(tmp_path, fake_fit, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_FIT_SLEEP", "0.3")
    assert main([str(_spec_file(tmp_path)), "--jobs", "4"], fit_prefix=fake_fit) == 0
    out = tmp_path / "runs"
    for name in ("mix=0,seed=0", "mix=0.5,seed=0"):
        (parent,) = _invocations(out / "distill" / name)
        (child,) = _invocations(out / "grpo" / name)
        assert child["start"] >= parent["end"]
        argv = child["argv"]
        assert argv[argv.index("--config") + 1] == str(tmp_path / "grpo.yaml")
        overrides = yaml.safe_load((out / "grpo" / name / "overrides.yaml").read_text())
        assert overrides == {
            "model": {"student": str(out / "distill" / name / "student")},
            "seed_everything": 0,
        }
        record = json.loads((out / "grpo" / name / "settings.json").read_text())
        assert record["stage"] == "grpo" and record["after"]["run"] == name
    stage_record = json.loads((out / "grpo" / "sweep.json").read_text())
    assert stage_record["axes"] == {"mix": [0, 0.5], "seed": [0]}
    assert [s["name"] for s in json.loads((out / "sweep.json").read_text())["stages"]] == ["distill", "grpo"]


def test_a_failed_parent_fails_its_chained_run_without_starting_it(tmp_path, fake_fit, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_FIT_CRASH", "mix=0.5")  # the parent (and its chained run, were it started)
    assert main([str(_spec_file(tmp_path))], fit_prefix=fake_fit) == 1
    out = capsys.readouterr().out
    assert "FAILED grpo/mix=0.5,seed=0 (its parent" in out
    assert not (tmp_path / "runs" / "grpo" / "mix=0.5,seed=0").exists()
    assert rundirs.run_state(tmp_path / "runs" / "grpo" / "mix=0,seed=0").finished


def test_emit_slurm_refuses_chained_stages(tmp_path, capsys):
    assert main([str(_spec_file(tmp_path)), "--emit-slurm", str(tmp_path / "a.sh")]) == 2
    assert "does not handle chained stages" in capsys.readouterr().err


def _run(stage_dir: Path, name: str, settings: dict, metrics: dict, after: str | None = None) -> None:
    run_dir = stage_dir / name
    run_dir.mkdir(parents=True)
    record = {"name": name, "settings": settings} | (
        {"after": {"stage": "distill", "run": after}} if after else {}
    )
    (run_dir / "settings.json").write_text(json.dumps(record))
    (run_dir / "metrics.json").write_text(json.dumps({"status": "finished", "metrics": metrics}))


def test_report_shows_accuracy_before_and_after_by_divergence_and_mix(tmp_path):
    out = tmp_path / "runs"
    stages = [{"name": "distill", "after": None}, {"name": "grpo", "after": "distill"}]
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"name": "chain", "stages": stages}))
    before = {(0, 0): 0.2, (0, 1): 0.3, (1, 0): 0.5, (1, 1): 0.6}
    gain = {0: 0.25, 1: 0.05}
    for (mix, seed), acc in before.items():
        name = f"divergence=forward_kl,mix={mix},seed={seed}"
        settings = {"divergence": "forward_kl", "mix": mix, "seed": seed}
        hard = {"test/countdown3/accuracy": acc, "test/countdown4/accuracy": acc / 2}
        _run(out / "distill", name, settings, hard)
        after = {k: v + gain[mix] for k, v in hard.items()}
        _run(out / "grpo", name, settings, after, after=name)
    path = build_report(out, n_boot=10, with_plots=False)
    text = path.read_text()
    assert (path.parent / "distill" / "report.md").is_file() and (
        path.parent / "grpo" / "report.md"
    ).is_file()
    assert "## Before/after: distill → grpo" in text
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| mix=")}
    assert set(rows) == {"mix=0", "mix=1"}
    cells = [c.strip() for c in rows["mix=0"].strip("|").split("|")]
    # countdown3 before, after, delta; then countdown4 likewise.
    # accuracies in percent with one decimal
    assert cells[1] == "25.0 ± 7.1 (2)" and cells[2] == "50.0 ± 7.1 (2)"
    assert cells[3] == "+25.0 ± 0.0 (2)"
    assert cells[4] == "12.5 ± 3.5 (2)" and cells[6] == "+25.0 ± 0.0 (2)"
    assert [c.strip() for c in rows["mix=1"].strip("|").split("|")][3] == "+5.0 ± 0.0 (2)"
    # on − off-policy before (0.2/0.3 against 0.5/0.6: −30 in both pairs) and after (−10: mix 0
    # gained 25 points, mix 1 only 5); no spread between the pairs, so no interval (not [−30, −30])
    assert "### mix=0 − mix=1 (on − off-policy) before and after" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| divergence=forward_kl |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["-30.0 (2)", "-10.0 (2)"]
    assert cells[3:5] == ["-15.0 (2)", "+5.0 (2)"]


@pytest.mark.slow
def test_chained_student_lands_where_grpo_fit_reads_it(tmp_path):
    import subprocess

    root = Path(__file__).resolve().parents[2]
    spec = parse_spec(
        {
            "name": "contract",
            "out": str(tmp_path / "runs"),
            "stages": [
                {"name": "distill", "base": str(root / "configs/tiny/base.yaml"), "axes": {"seed": [3]}},
                {"name": "grpo", "after": "distill", "base": str(root / "configs/tiny/grpo_countdown.yaml")},
            ],
        }
    )
    child = expand(spec)[-1]
    rundirs.prepare_run_dir(child, spec.name)
    done = subprocess.run(
        [*rundirs.fit_command(child, spec.base), "--print_config"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    config = yaml.safe_load(done.stdout)
    assert config["model"]["class_path"] == "distill.rl.GRPOModule"
    assert config["model"]["init_args"]["student"] == str(tmp_path / "runs/distill/seed=3/student")
    assert config["seed_everything"] == 3

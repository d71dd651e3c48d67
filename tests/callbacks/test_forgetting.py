"""Forgetting: a tiny student taught a retention set and then trained on something else forgets it,
and the callback's delta says so; NLL text sets (lists, files, text specs); dataset-spec sets stay
disjoint from the run's training rows; the step-0 baseline survives resuming; the text NLL is
computed lean (LM head in chunks, never full float32 logits) and capped per text."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

from distill.callbacks import Forgetting, forgetting
from distill.models.forward import causal_nll
from distill.models.tiny import char_tokenizer, llama_config
from distill.tasks.registry import get_task
from distill.tasks.text_datasets import load_text_set


def lm_steps(model, tokenizer, texts: list[str], steps: int, lr: float) -> None:
    """Plain next-token training on `texts` (each ends with EOS)."""
    enc = tokenizer([t + tokenizer.eos_token for t in texts], return_tensors="pt", padding=True)
    ids, attn = enc["input_ids"], enc["attention_mask"]
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, :-1]
        mask = attn[:, 1:].bool() & attn[:, :-1].bool()
        loss = F.cross_entropy(logits[mask], ids[:, 1:][mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def test_delta_rises_when_the_student_is_trained_away(tiny_student, fake_trainer, fake_module, char_tok):
    cb = Forgetting(sets=["reversal"], num_examples=4, every_n_steps=5, max_new_tokens=12)
    module, trainer = fake_module(tiny_student), fake_trainer()
    rows = cb.rows["reversal"]
    # Teach the retention set (memorise its 4 examples) until the student scores on it.
    torch.manual_seed(0)
    lm_steps(tiny_student, char_tok, [r["prompt"] + r["reference"] for r in rows], steps=150, lr=1e-2)
    cb.on_train_start(trainer, module)
    start = cb.latest["forgetting/reversal/score"]
    assert start > 0.5
    assert cb.latest["forgetting/reversal/delta"] == 0.0
    # Train on other text (same prompts, wrong completions): the retention score must fall.
    lm_steps(tiny_student, char_tok, [r["prompt"] + "zzzz" for r in rows], steps=60, lr=1e-2)
    trainer.global_step = 5
    cb.on_train_batch_end(trainer, module, None, None, 0)
    score, delta = cb.latest["forgetting/reversal/score"], cb.latest["forgetting/reversal/delta"]
    assert score < start
    assert delta == pytest.approx(start - score) and delta > 0
    assert cb.latest["forgetting/mean_delta"] == pytest.approx(delta)
    logged = trainer.loggers[0].calls
    assert [step for step, _ in logged] == [0, 5]
    assert float(trainer.callback_metrics["forgetting/reversal/delta"]) == pytest.approx(delta)


def test_nll_set_matches_direct_computation_and_positive_delta_means_forgetting(
    tiny_student, fake_trainer, fake_module, char_tok, tmp_path
):
    texts = ["hello world", "ab", "a much longer line of text"]
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(texts) + "\n\n")
    cb = Forgetting(sets=[], nll_texts={"file": str(path), "inline": texts[:1]}, batch_size=2)
    assert cb.nll_texts["file"] == texts  # blank lines skipped
    module = fake_module(tiny_student)
    total = count = 0.0
    for text in texts:  # one unpadded text at a time, independent of the callback's batching
        ids = char_tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = tiny_student(input_ids=ids).logits[0, :-1, : len(char_tok)]
        total += float(F.cross_entropy(logits.double(), ids[0, 1:], reduction="sum"))
        count += ids.shape[1] - 1
    assert cb.nll_per_token(module, texts) == pytest.approx(total / count, rel=1e-5)

    trainer = fake_trainer()
    cb.on_train_start(trainer, module)
    with torch.no_grad():  # make the student worse at predicting: NLL up, delta positive
        for p in tiny_student.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    trainer.global_step = 3
    cb.on_train_end(trainer, module)
    assert cb.latest["forgetting/file/score"] > cb.baseline["file"]
    assert cb.latest["forgetting/file/delta"] == pytest.approx(
        cb.latest["forgetting/file/score"] - cb.baseline["file"]
    )
    assert cb.latest["forgetting/file/delta"] > 0


def test_baseline_survives_resume(tiny_student, fake_trainer, fake_module):
    cb = Forgetting(sets=[], nll_texts={"t": ["hello world"]})
    module, trainer = fake_module(tiny_student), fake_trainer()
    cb.on_train_start(trainer, module)
    state = cb.state_dict()
    with torch.no_grad():
        for p in tiny_student.parameters():
            p.mul_(1.5)
    resumed = Forgetting(sets=[], nll_texts={"t": ["hello world"]})
    resumed.load_state_dict(state)
    trainer.global_step = 10
    resumed.on_train_start(trainer, module)  # a resumed fit starts again: no measurement of its own
    assert resumed.latest == cb.latest and resumed.last_step == 0
    resumed._measure(trainer, module)  # its next one, against the kept baseline
    assert resumed.baseline == cb.baseline
    assert resumed.latest["forgetting/t/delta"] == pytest.approx(
        resumed.latest["forgetting/t/score"] - cb.baseline["t"]
    )
    assert resumed.latest["forgetting/t/delta"] != 0.0


def direct_nll(model, tokenizer, texts: list[str], vocab_size: int, max_tokens: int | None = None):
    """Each text's token NLLs (float64), one unpadded text at a time from the full logits, as
    `nll_per_token` computed them before the lean path."""
    out = []
    for text in texts:
        ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :max_tokens]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1, :vocab_size]
        out.append(F.cross_entropy(logits.double(), ids[0, 1:], reduction="none"))
    return torch.cat(out)


@pytest.mark.parametrize("side", ["left", "right"])
def test_lean_nll_equals_full_logits_with_padding_on_either_side(tiny_student, fake_module, side):
    tok = char_tokenizer()
    tok.padding_side = side
    module = fake_module(tiny_student)
    module.tokenizer = tok
    texts = ["hello world", "ab", "a much longer line of text", "xyz"]
    expected = direct_nll(tiny_student, tok, texts, len(tok))
    enc = tok(texts, return_tensors="pt", padding=True)
    ids, attn = enc["input_ids"], enc["attention_mask"]
    assert not attn.all()  # padded, on `side`
    mask = attn[:, 1:].bool() & attn[:, :-1].bool()
    with torch.no_grad():  # 2 positions per head chunk (112 logits of 4 bytes): many chunk edges
        lean = causal_nll(tiny_student, ids, attn, len(tok), mask, budget_mb=0.001)
    torch.testing.assert_close(lean.double(), expected, rtol=1e-5, atol=1e-5)
    cb = Forgetting(sets=[], nll_texts={"t": texts}, batch_size=3)
    assert cb.nll_per_token(module, texts) == pytest.approx(float(expected.mean()), rel=1e-5)


def test_a_head_that_does_more_than_the_projection_is_refused(tiny_student, char_tok):
    # As Gemma 2's final soft-capping or a logit scale would: the head applied by hand would miss it.
    tiny_student.register_forward_hook(lambda m, args, out: CausalLMOutputWithPast(logits=out.logits * 0.5))
    ids = char_tok(["some text"], return_tensors="pt")["input_ids"]
    attn = torch.ones_like(ids)
    with torch.no_grad(), pytest.raises(ValueError, match="not its LM head applied"):
        causal_nll(tiny_student, ids, attn, len(char_tok), attn[:, 1:].bool(), budget_mb=1.0)


class Allocations(TorchDispatchMode):
    """Shapes of the float32 tensors the ops allocate (outputs sharing an input's storage, such as
    views, left out)."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if (
                isinstance(t, torch.Tensor)
                and t.dtype == torch.float32
                and t.untyped_storage().data_ptr() not in inputs
            ):
                self.shapes.append(tuple(t.shape))
        return out


def test_text_nll_never_holds_full_float32_logits(fake_module, monkeypatch):
    vocab = 4096
    torch.manual_seed(0)
    student = LlamaForCausalLM(llama_config(vocab_size=vocab, hidden_size=32, num_layers=1, num_heads=2))
    texts = ["a line of some forty characters or more", "short", "another text, with a few words"]
    monkeypatch.setattr(forgetting, "NLL_LOGIT_BUDGET_MB", 0.25)  # 16 positions of 4096 float32 logits
    cb = Forgetting(sets=[], nll_texts={"t": texts}, batch_size=len(texts))
    with Allocations() as seen:
        cb.nll_per_token(fake_module(student), texts)
    rows = [math.prod(shape[:-1]) for shape in seen.shapes if shape and shape[-1] == vocab]
    predicted = len(texts) * len(texts[0])  # B * (T - 1): bos + one token per character
    assert rows and max(rows) <= 16 < predicted


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sets": ["nope"]}, r"Forgetting.sets must be task names from .* \(unknown: \['nope'\]\)"),
        ({"sets": [], "nll_texts": None}, "sets and nll_texts are both empty"),
        (
            {"nll_texts": {"x": "/no/such/file.txt"}},
            r"nll_texts\['x'\]: file '/no/such/file.txt' does not exist",
        ),
        ({"nll_texts": {"addition": ["a b"]}}, r"names \['addition'\] are in both"),
        ({"every_n_steps": 0}, "Forgetting.every_n_steps must be an integer >= 1, got 0"),
        ({"max_text_tokens": 1}, "Forgetting.max_text_tokens must be an integer >= 2, got 1"),
    ],
)
def test_options_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Forgetting(**kwargs)


def test_text_nll_is_capped_at_max_text_tokens(tiny_student, fake_module, char_tok):
    texts = ["a text much longer than the cap of eight tokens", "tiny"]
    cb = Forgetting(sets=[], nll_texts={"t": texts}, max_text_tokens=8)
    capped = direct_nll(tiny_student, char_tok, texts, len(char_tok), max_tokens=8)
    assert capped.numel() == 7 + 4  # <bos> + 7 characters, <bos> + "tiny"
    score = cb.nll_per_token(fake_module(tiny_student), texts)
    assert score == pytest.approx(float(capped.mean()), rel=1e-5)
    assert score != pytest.approx(float(direct_nll(tiny_student, char_tok, texts, len(char_tok)).mean()))


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SCIQ = FIXTURES / "qa" / "sciq.jsonl"
PASSAGES = FIXTURES / "text" / "passages.csv"


def test_text_spec_sets_score_nll_on_their_fixed_rows(tiny_student, fake_trainer, fake_module):
    spec = f"text:{PASSAGES}?field=text&rows=3&seed=1"
    cb = Forgetting(sets=[], nll_texts={"passages": spec}, batch_size=2)
    texts = load_text_set(spec).select()
    assert cb.nll_texts["passages"] == texts and len(texts) == 3
    module, trainer = fake_module(tiny_student), fake_trainer()
    cb.on_train_start(trainer, module)
    assert cb.latest["forgetting/passages/score"] == pytest.approx(cb.nll_per_token(module, texts))


def test_dataset_sets_stay_disjoint_from_the_runs_training_rows(fake_trainer, fake_module, tiny_student):
    # Trained on SciQ's fixture with one hold-out; retention on the same file with another one,
    # and its `support` texts: neither may contain a row the run trains on.
    training = get_task(f"sciq:{SCIQ}?val=2&test=2&seed=5")
    trained = {training.items[i].source_index for i in training.parts["train"]}
    retention = f"sciq:{SCIQ}?val=4&test=4&seed=9"
    cb = Forgetting(
        sets=[retention],
        nll_texts={"support": f"text:{SCIQ}?field=support&rows=20"},
        num_examples=8,
    )
    name = get_task(retention).name
    assert len(cb.rows[name]) == 8  # before setup: its held-out parts (validation, then test)
    assert {r["source_index"] for r in cb.rows[name]} & trained
    cb.setup(fake_trainer(datamodule=SimpleNamespace(task=training)), fake_module(tiny_student), "fit")
    kept = {r["source_index"] for r in cb.rows[name]}
    assert kept and not kept & trained
    assert kept <= {
        get_task(retention).items[i].source_index
        for i in (*get_task(retention).parts["val"], *get_task(retention).parts["test"])
    }
    with SCIQ.open() as f:
        support = [json.loads(line)["support"] for line in f]
    assert sorted(cb.nll_texts["support"]) == sorted(
        support[i] for i in range(len(support)) if i not in trained
    )


def test_qa_sets_score_the_extracted_answer_as_the_task_does(
    fake_trainer, fake_module, tiny_student, monkeypatch
):
    spec = f"sciq:{SCIQ}?val=3&test=3"
    cb = Forgetting(sets=[spec], num_examples=6, max_new_tokens=8)
    rows = cb.rows[get_task(spec).name]

    letter = rows[0]["answer"]

    class Written:  # the student gives one letter to every question, in a chat model's words
        def completions(self, tokenizer):
            return [f"Reasoning first. The answer is ({letter})"] * len(rows)

    monkeypatch.setattr(forgetting, "student_rollouts", lambda *args: [Written()])
    scores = cb.scores(fake_trainer(), fake_module(tiny_student))
    expected = sum(row["answer"] == letter for row in rows) / len(rows)
    assert scores == {get_task(spec).name: pytest.approx(expected)}
    assert 0 < expected < 1  # the shuffled options put that letter right on some rows only


@pytest.mark.slow  # builds the quick tiny world once per session (shared with tests/test_cli.py)
def test_distill_fit_measures_retention_from_dataset_specs(tiny_world_cache, tmp_path, monkeypatch):
    """Through `distill fit`: trained on the SciQ fixture, retention on the MedReason fixture
    (accuracy) and on the SciQ passages the run does not train on (NLL)."""
    from distill.lightning_cli import run_lightning_cli

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    train = f"sciq:{SCIQ}?val=3&test=4"
    medreason = f"medreason:{FIXTURES / 'qa' / 'medreason.jsonl'}?val=2&test=2"
    forgetting = {
        "class_path": "distill.callbacks.Forgetting",
        "init_args": {
            "sets": [medreason],
            "nll_texts": {"sciq_support": f"text:{SCIQ}?field=support&rows=20"},
            "num_examples": 4,
            "every_n_steps": 1,
            "max_new_tokens": 8,
        },
    }
    short = {
        "trainer.max_steps": "2",
        "trainer.val_check_interval": "2",
        "trainer.callbacks": json.dumps([forgetting]),
        "data.task": train,
        "data.evaluation.test_tasks": json.dumps([train]),
        "data.batch_size": "4",
        "data.evaluation.val_size": "3",
        "data.evaluation.test_size": "4",
        "data.evaluation.batch_size": "8",
        "data.sampling.max_new_tokens": "8",
        "data.evaluation.max_new_tokens": "8",
        "data.train_size": "13",
        "run_dir": str(tmp_path / "run"),
    }
    args = [a for key, value in short.items() for a in (f"--{key}", value)]
    metrics = run_lightning_cli(["fit", "--config", "configs/tiny/base.yaml", *args])
    name = get_task(medreason).name
    assert 0.0 <= metrics[f"forgetting/{name}/score"] <= 1.0
    assert metrics["forgetting/sciq_support/score"] > 0.0 and "forgetting/mean_delta" in metrics
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["status"] == "finished"
    # Independently: the exported (final) student's NLL per token on the passages of the 7 rows
    # the run held out, i.e. the text set minus the 13 rows it trained on.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    student = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "student").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "student")
    task = get_task(train)
    held_out = sorted({task.items[i].source_index for i in (*task.parts["val"], *task.parts["test"])})
    with SCIQ.open() as f:
        support = [json.loads(line)["support"] for line in f]
    assert len(held_out) == 7
    total = count = 0.0
    for index in held_out:
        ids = tokenizer(support[index], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = student(input_ids=ids).logits[0, :-1, : len(tokenizer)]
        total += float(F.cross_entropy(logits.double(), ids[0, 1:], reduction="sum"))
        count += ids.shape[1] - 1
    assert metrics["forgetting/sciq_support/score"] == pytest.approx(total / count, rel=1e-4)

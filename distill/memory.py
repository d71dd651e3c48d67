"""Per-GPU memory of a run, by component and phase: the arithmetic behind the memory tables of
docs/gpus-and-memory.md (`python -m distill.memory` prints them), checked against the live tensor bytes of small models
(tests/test_memory.py, with `distill.live_bytes.LiveTensorBytes`) and, on a GPU, by
benchmarks/gpu_smoke.py. The models' shapes and the bytes of their parts: `distill.model_shapes`.

Counted for `bf16-mixed` with a float32 student, as the paper configs run, under Lightning's
autocast (`torch.autocast(..., cache_enabled=False)`, the context steps, rollouts and callbacks run
in: `distill.precision`): the resident weights and AdamW's moments (sharded under FSDP2), DDP's
gradient buckets; the bf16 copies of the student's matmul weights that autograd saves for
backward, from a micro-batch's forward to its backward (2 B per cast parameter, whole even under
FSDP2); outside the step no such copy outlives its matmul, so rollouts, evaluation and callbacks
count only the largest one, the LM head's, while it is alive (`largest_cast`); KV caches (the
autocast student's keys are float32: its residual stream and RoPE tables are); a step's gradients,
saved activations, logits and its transients (`step_components`); the decoding of rollouts and
evaluation batches (`decode`); the callbacks' spikes (`estimate`).
Activations are those of Hugging Face Llama/Qwen2 layers with SDPA attention and a padding mask,
without activation checkpointing. Not counted: the CUDA allocator's caching and fragmentation
(`max_memory_reserved` over `max_memory_allocated`), the CUDA context, NCCL's buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from distill.live_bytes import LiveTensorBytes
from distill.model_shapes import (
    BF16,
    FP32,
    HUB,
    LLAMA_1B,
    LLAMA_8B,
    QWEN_1_5B,
    QWEN_7B,
    TOKENIZER_SIZE,
    Architecture,
)

# The model shapes (`distill.model_shapes`) and the live-bytes meter (`distill.live_bytes`) are
# re-exported: tests, benchmarks and docs/run-your-own-pair.md import them from here.
__all__ = [
    "BF16",
    "FP32",
    "GB",
    "HUB",
    "LLAMA_1B",
    "LLAMA_8B",
    "QWEN_1_5B",
    "QWEN_7B",
    "TOKENIZER_SIZE",
    "Architecture",
    "LiveTensorBytes",
    "Run",
    "decode",
    "decode_bytes_per_step",
    "engine_bytes",
    "engine_kv_tokens",
    "estimate",
    "grpo_runs",
    "kv_bytes",
    "paper_runs",
    "readme_tables",
    "step_components",
    "step_peaks",
    "table",
    "vllm_runs",
]

GB = 1e9
ITEMSIZE_NAMES = {BF16: "bf16", FP32: "fp32"}


@dataclass(frozen=True)
class Run:
    """What one GPU of a run holds. Defaults: the paper configs (configs/paper/*_base.yaml and their
    callbacks), every rollout running to its token budget, prompts of `prompt_tokens`."""

    student: Architecture
    teacher: Architecture | None = None  # distillation
    reference: Architecture | None = None  # GRPO
    frozen_itemsize: int = BF16  # bytes per parameter of the teacher or reference (teacher_dtype)
    strategy: str = "single"  # single, ddp or fsdp
    world: int = 1
    rollout_rows: int = 32  # sequences sampled per GPU and step (batch_size x group_size)
    teacher_share: float = 0.0  # data.mix, sequence granularity: that share of rows, decoded apart
    prompt_tokens: int = 256
    new_tokens: int = 512
    micro_batch: int = 4
    gradient_stats: bool = True
    eval_rows: int = 64  # data.evaluation.batch_size (TaskEvaluation samples in batches of it too)
    eval_new_tokens: int = 1024
    eval_logit_budget_mb: float = 512.0
    forgetting_rows: int = 32  # Forgetting.batch_size (StyleProbe's batch is the same in the configs)
    forgetting_new_tokens: int = 512
    text_tokens: int = 512  # Forgetting.max_text_tokens
    nll_logit_budget_mb: float = 128.0  # distill.callbacks.forgetting.NLL_LOGIT_BUDGET_MB
    entropy_logits: int = 2**26  # distill.callbacks.task_evaluation.LOGIT_BUDGET
    loss_chunk_logits: int = 2**23  # distill.losses.chunked.CHUNK_ELEMENTS (positions = this // vocab)
    # `data.engine: vllm` (distill.rollout.vllm_engine.VLLMSettings): each model that writes rows has
    # an engine on this GPU (every rank its own); the native decoder still runs evaluation and the
    # callbacks.
    engine: str = "native"
    gpu_gb: float = 80.0  # the GPU's memory in GiB, of which an engine takes gpu_memory_utilization
    gpu_memory_utilization: float = 0.3
    kv_cache_gb: float | None = None  # GiB; instead of gpu_memory_utilization
    sleep: bool = False  # engines asleep (weights in host memory, KV cache freed) outside rollouts
    tensor_parallel_size: int = 1
    engine_itemsize: int = FP32  # the student's engine (dtype auto: the float32 student's own)

    def __post_init__(self):
        if self.strategy not in ("single", "ddp", "fsdp"):
            raise ValueError(f"Run.strategy must be single, ddp or fsdp, got {self.strategy!r}")
        if self.strategy == "single" and self.world != 1:
            raise ValueError(f"Run.world must be 1 for strategy single, got {self.world}")
        if self.engine not in ("native", "vllm"):
            raise ValueError(f"Run.engine must be native or vllm, got {self.engine!r}")


def kv_bytes(model: Architecture, rows: int, tokens: int, student: bool) -> int:
    """KV cache of `rows` x `tokens`: keys in float32 for the autocast student (its residual stream
    and RoPE tables are float32), values in bf16; a bf16 model caches both in bf16."""
    return rows * tokens * model.kv_bytes_per_token(FP32 if student else BF16, BF16)


def decode(
    model: Architecture, rows: int, prompt: int, new: int, cache: int = 0, *, student: bool | None = None
) -> int:
    """A decoding pass's peak beyond the weights. `student`: the float32 model under bf16 autocast
    (float32 keys; each matmul casts its weight), else a bf16 model; it defaults to `cache > 0`.
    `cache`: a weight cache held through the pass by an autocast with `cache_enabled=True`
    (torch's default, 2 x `cast_params()`); 0 under Lightning's autocast (`cache_enabled=False`),
    the context rollouts and callbacks run in, where a cast copy lives only for its own matmul.

    The peak is one of: the prefill's layer working set (`prefill_bytes`, at the MLP's product,
    when no weight copy is alive), or the prefill's LM head (the final norm's float32 output and
    the head's copy, logits of the last position only) beside the prompt's KV cache; or the last
    steps: the whole KV cache plus the largest of one layer's copy as the cache grows
    (`torch.cat`), the LM head's copy beside its bf16 logits and the previous step's (alive until
    the step's forward returns), and the sampled logits' chain (bf16,
    float32, softmax and the inverse CDF's float64 copies: 26 B a logit). With a held cache,
    the prefill peaks in the last layer, its down projection and the LM head not cast yet."""
    student = cache > 0 if student is None else student
    head = 0 if cache or not student else model.largest_cast() + 2 * BF16 * rows * model.vocab
    late = BF16 * model.hidden * (model.vocab + model.intermediate) if cache else 0
    prompt_kv = kv_bytes(model, rows, prompt, student)
    prefill_head = FP32 * rows * prompt * model.hidden + head if head else 0
    prefill = cache - late + max(model.prefill_bytes(rows, prompt), prefill_head) + prompt_kv
    full = kv_bytes(model, rows, prompt + new, student)
    return max(prefill, cache + full + max(full // model.layers, head, rows * model.vocab * 26))


def decode_bytes_per_step(model: Architecture, rows: int, context: int, student: bool) -> int:
    """Bytes one decode step reads: every matmul weight once in bf16 (for the float32 student, the
    copies of an autocast that caches them, torch's default, as benchmarks/gpu_smoke.py decodes; an
    untied embedding is only looked up) and the KV cache of `rows` rows of `context` tokens. The
    memory-bandwidth floor of decoding is `rows` tokens per that many bytes over the GPU's
    bandwidth. Under Lightning's autocast (`cache_enabled=False`) each step casts every weight
    anew: the student reads its float32 weights and writes and reads their copies (8 B, not 2 B,
    per cast parameter)."""
    return BF16 * model.cast_params() + kv_bytes(model, rows, context, student)


# vLLM's defaults for an engine's profiling pass (its activations' peak, before the KV cache is
# sized): a batch of this many tokens, and sampling logits for this many sequences.
ENGINE_BATCHED_TOKENS = 8192
ENGINE_MAX_SEQS = 256


def engine_kv_tokens(model: Architecture, kv_cache_bytes: int, itemsize: int, tensor_parallel_size: int = 1) -> int:
    """Tokens (prompt and completion, every row together) an engine's KV cache of `kv_cache_bytes`
    a GPU holds: keys and values in the engine's dtype, the KV heads split over its GPUs."""
    return kv_cache_bytes * tensor_parallel_size // model.kv_bytes_per_token(itemsize, itemsize)


def engine_bytes(model: Architecture, itemsize: int, run: Run) -> int:
    """What one vLLM engine holds on each of its GPUs while awake. With `kv_cache_gb`: its share of
    the weights, that KV cache, and the activations of vLLM's profiling pass (a prefill of
    `ENGINE_BATCHED_TOKENS` tokens, whole, and float32 logits for `ENGINE_MAX_SEQS` rows). Else
    vLLM sizes the KV cache to fill `gpu_memory_utilization` of the GPU, all of which it takes.
    Not counted: CUDA graphs, the CUDA context."""
    if run.kv_cache_gb is None:
        return int(run.gpu_memory_utilization * run.gpu_gb * 2**30)
    weights = itemsize * model.params() // run.tensor_parallel_size
    profile = model.prefill_bytes(1, ENGINE_BATCHED_TOKENS) + FP32 * ENGINE_MAX_SEQS * model.vocab
    return weights + int(run.kv_cache_gb * 2**30) + profile


def step_components(run: Run) -> dict[str, int]:
    """What a training step adds beyond the gradients and the bf16 weight copies autograd saves
    (bytes per GPU)."""
    s, frozen = run.student, run.teacher or run.reference
    mb, seq, keep = run.micro_batch, run.prompt_tokens + run.new_tokens, run.new_tokens
    other = frozen.vocab if frozen is not None else 0
    buffer = mb * keep * s.vocab * BF16  # the loss's gradient w.r.t. the student's logits
    sliced = mb * (keep + 1) * s.vocab * BF16  # that gradient padded back to the head's output
    shard = s.params() // (run.world if run.strategy == "fsdp" else 1)
    return {
        "step: activations": s.activation_bytes(mb, seq, keep),
        # both models' bf16 logits of K + 1 columns, alive until the loss's backward has run
        "step: logits": mb * (keep + 1) * (s.vocab + other) * BF16,
        "step: loss gradient": buffer,
        # the chunked loss's working set: both models' float32 chunk, its log-softmax and exp,
        # their difference (7 x 4 B) and the rows' bf16 copies (2 x 2 B) per logit of a chunk
        "step: loss chunks": 32 * min(max(1, run.loss_chunk_logits // s.vocab), mb * keep) * s.vocab,
        "step: GradientStats float32 copy": 2 * FP32 * mb * keep * s.vocab if run.gradient_stats else 0,
        # the padded gradient beside the buffer, then (buffer freed) beside the head's bf16 weight
        # gradient (cast to float32 only at the end of backward, once the activations are gone)
        "step: LM-head backward": sliced + max(0, s.vocab * s.hidden * BF16 - buffer),
        "step: optimiser foreach temporary": FP32 * shard,  # sqrt(v), all parameters at once
    }


def step_peaks(c: dict[str, int]) -> tuple[int, int]:
    """(backward, optimiser): the step's two candidate peaks beyond the gradients, the first also
    beyond the saved bf16 weight copies. Backward starts with every activation, those copies, both
    models' logits and the loss's gradient buffer alive, and meets the loss's chunks. Only autograd
    holds the logits (the micro-batch's loss is built in a function that returns), so once the
    loss's backward has run they are freed, and GradientStats' copy and the LM head's backward meet
    the gradient alone. The optimiser step comes after backward has freed them all."""
    grad, chunks = c["step: loss gradient"], c["step: loss chunks"]
    after_loss = max(c["step: GradientStats float32 copy"], c["step: LM-head backward"])
    backward = c["step: activations"] + grad + max(c["step: logits"] + chunks, after_loss)
    return backward, c["step: optimiser foreach temporary"]


def estimate(run: Run) -> dict[str, dict[str, int]]:
    """Bytes per GPU: {"components": {name: bytes}, "phases": {phase: peak bytes}}. Each phase
    (rollout, step, evaluation, callbacks) is the resident memory plus what that phase holds at
    its peak; `peak` is their maximum."""
    s, frozen = run.student, run.teacher or run.reference
    n = run.world if run.strategy == "fsdp" else 1
    p = s.params()
    c: dict[str, int] = {}
    if frozen is not None:
        role = "teacher" if run.teacher is not None else "reference"
        c[f"{role}, {ITEMSIZE_NAMES[run.frozen_itemsize]}"] = run.frozen_itemsize * frozen.params()
    c["student weights"] = FP32 * p // n
    c["AdamW moments"] = 2 * FP32 * p // n
    c["DDP gradient buckets"] = FP32 * p if run.strategy == "ddp" else 0
    resident = sum(c.values())
    # Outside the step (rollouts, evaluation, measurements) FSDP2 gathers the whole student.
    gathered = c["FSDP2 gathered student"] = FP32 * p if run.strategy == "fsdp" else 0

    # Sequence granularity decodes the teacher's rows and the student's apart.
    t_rows = math.ceil(run.teacher_share * run.rollout_rows) if run.teacher is not None else 0
    s_rows = run.rollout_rows - t_rows
    if run.engine == "vllm":
        # Each model that writes rows has its engine on this GPU, awake from its rollout on (asleep
        # outside rollouts with `sleep`); the native decoder writes no training rows.
        c["vLLM: student engine"] = engine_bytes(s, run.engine_itemsize, run) if s_rows else 0
        t_engine = engine_bytes(run.teacher, run.frozen_itemsize, run) if t_rows else 0
        c["vLLM: teacher engine"] = t_engine
        c["rollout: KV cache, prefill, sampled logits"] = 0
    else:
        c["vLLM: student engine"] = c["vLLM: teacher engine"] = 0
        decodes = [decode(s, s_rows, run.prompt_tokens, run.new_tokens, student=True)] if s_rows else []
        if t_rows:
            decodes.append(decode(run.teacher, t_rows, run.prompt_tokens, run.new_tokens))
        c["rollout: KV cache, prefill, sampled logits"] = max(decodes)
    engines = c["vLLM: student engine"] + c["vLLM: teacher engine"]
    awake = 0 if run.sleep else engines  # outside the rollouts

    c["step: gradients"] = FP32 * p // n
    # Autograd saves each linear's bf16 weight copy for backward (whole under FSDP2: the copies
    # outlive the resharding of the float32 weights), from a micro-batch's forward to its backward.
    saved = c["step: bf16 weight copies saved for backward"] = BF16 * s.cast_params()
    # FSDP2: the root unit (embedding / LM head, final norm) whole from forward to backward, two
    # blocks gathered (one prefetched) and one block's unsharded gradients.
    fsdp = run.strategy == "fsdp"
    fsdp_units = FP32 * (s.vocab * s.hidden + s.hidden + 3 * s.block_params()) if fsdp else 0
    c["step: FSDP2 gathered units"] = fsdp_units
    c.update(step_components(run))
    backward, optimiser = step_peaks(c)
    step = c["step: gradients"] + fsdp_units + max(saved + backward, optimiser)

    eval_decode = decode(s, run.eval_rows, run.prompt_tokens, run.eval_new_tokens, student=True)
    c["evaluation: greedy decoding"] = eval_decode
    # logits of both models within the budget, beside the LM head's transient bf16 copy and then
    # the statistics' float32 chunks
    budget = int(run.eval_logit_budget_mb * 2**20)
    c["evaluation: scoring"] = budget + max(s.largest_cast(), 32 * run.loss_chunk_logits)

    # Callbacks run one after another: their spikes do not add up.
    c["callbacks: TaskEvaluation decoding"] = eval_decode
    per_row = run.eval_new_tokens * s.vocab
    c["callbacks: TaskEvaluation entropy"] = max(1, run.entropy_logits // per_row) * per_row * 22
    c["callbacks: Forgetting / StyleProbe decoding"] = decode(
        s, run.forgetting_rows, run.prompt_tokens, run.forgetting_new_tokens, student=True
    )
    tokens = run.forgetting_rows * run.text_tokens
    # float32 logits a chunk; the head's bf16 output beside its transient weight copy, then the
    # float32 logits and their log-softmax
    chunk = int(run.nll_logit_budget_mb * 2**20)
    c["callbacks: Forgetting text NLL"] = max(
        s.prefill_bytes(run.forgetting_rows, run.text_tokens),
        2 * FP32 * s.hidden * tokens + max(s.largest_cast() + chunk // 2, chunk * 5 // 2),
    )
    c["callbacks: UpdateSparsity"] = 4 * FP32 * 2**24  # float32 slices of 2**24 entries
    callbacks = max(v for k, v in c.items() if k.startswith("callbacks:"))

    outside = resident + gathered
    phases = {
        "rollout": outside + engines + c["rollout: KV cache, prefill, sampled logits"],
        "step": resident + awake + step,
        "evaluation": outside + awake + max(eval_decode, c["evaluation: scoring"]),
        "callbacks": outside + awake + callbacks,
    }
    phases["peak"] = max(phases.values())
    return {"components": c, "phases": phases}


# --- the tables of docs/gpus-and-memory.md ------------------------------------------


def paper_runs(student: Architecture, teacher: Architecture) -> dict[str, Run]:
    """The tables' columns: configs/paper/<pair>_base.yaml on 1 GPU (32 rows a step), the same on
    MedReason (<pair>_medreason.yaml: 1,024 new tokens in training), and the base's global batch
    over N GPUs (llama_ddp.yaml, llama_fsdp.yaml: 32 / N rows per GPU); at the grid's largest
    rollout (mix 1: the teacher writes every row)."""
    base = Run(student, teacher, teacher_share=1.0)
    return {
        "1 GPU (base)": base,
        "1 GPU, MedReason": replace(base, new_tokens=1024),
        "DDP, N = 4": replace(base, strategy="ddp", world=4, rollout_rows=8),
        "FSDP2, N = 2": replace(base, strategy="fsdp", world=2, rollout_rows=16),
        "N = 4": replace(base, strategy="fsdp", world=4, rollout_rows=8),
        "N = 8": replace(base, strategy="fsdp", world=8, rollout_rows=4),
    }


def grpo_runs() -> dict[str, Run]:
    """configs/paper/grpo_{llama,qwen}.yaml on 1 GPU: 16 prompts x 8 completions, micro-batch 8, the
    reference in the policy's dtype (float32)."""
    return {
        a.name: Run(a, reference=a, frozen_itemsize=FP32, rollout_rows=128, micro_batch=8)
        for a in (LLAMA_1B, QWEN_1_5B)
    }


def vllm_runs() -> dict[str, Run]:
    """configs/paper/llama_base.yaml on one 80 GB GPU with `data.engine: vllm`, at mix 1 (the
    teacher's engine writes every row) and at mix 0 (the student's): each engine setting's cost."""
    teacher = Run(LLAMA_1B, LLAMA_8B, teacher_share=1.0, engine="vllm")
    student = replace(teacher, teacher_share=0.0)
    return {
        "native, mix 1": replace(teacher, engine="native"),
        "mix 1, 0.3 of the GPU": teacher,
        "mix 1, 0.3, sleep": replace(teacher, sleep=True),
        "mix 1, 8 GiB KV, sleep": replace(teacher, kv_cache_gb=8.0, sleep=True),
        "mix 1, 8 GiB KV, TP 2": replace(teacher, kv_cache_gb=8.0, tensor_parallel_size=2),
        "mix 0, 8 GiB KV": replace(student, kv_cache_gb=8.0),
        "mix 0, 8 GiB KV, bf16": replace(student, kv_cache_gb=8.0, engine_itemsize=BF16),
    }


LABELS = {
    "student weights": "student, fp32",
    "AdamW moments": "AdamW m and v, fp32",
    "DDP gradient buckets": "DDP gradient buckets, fp32",
    "step: bf16 weight copies saved for backward": "step: bf16 weight copies saved for backward (whole under FSDP2)",
    "FSDP2 gathered student": "FSDP2: the student gathered whole, outside the step",
    "rollout: KV cache, prefill, sampled logits": "rollout: KV caches, prefill, sampled logits",
    "vLLM: student engine": "vLLM: the student's engine",
    "vLLM: teacher engine": "vLLM: the teacher's engine",
    "step: logits": "step: logits (both models, bf16; freed by the loss's backward)",
    "step: loss gradient": "step: the loss's gradient w.r.t. the student's logits",
    "step: GradientStats float32 copy": "step: `GradientStats`' float32 gradient copy (every 10th step)",
    "step: LM-head backward": "step: LM head's backward",
    "step: optimiser foreach temporary": "step: AdamW's foreach temporary (after backward)",
}


def table(runs: dict[str, Run]) -> str:
    """A markdown table of `runs`' components and phase peaks, GB per GPU (a component that is 0
    in every column is left out; - marks one absent from a column)."""
    estimates = [estimate(run) for run in runs.values()]
    lines = ["| per GPU, GB | " + " | ".join(runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for key in estimates[0]["components"]:
        values = [e["components"][key] for e in estimates]
        if any(values):
            cells = " | ".join(f"{v / GB:.1f}" if v else "-" for v in values)
            lines.append(f"| {LABELS.get(key, key)} | {cells} |")
    for phase in estimates[0]["phases"]:
        cells = " | ".join(f"**{e['phases'][phase] / GB:.1f}**" for e in estimates)
        lines.append(f"| **{phase}{'' if phase == 'peak' else ' phase'}** | {cells} |")
    return "\n".join(lines)


def readme_tables() -> str:
    """The memory tables of docs/gpus-and-memory.md (`python -m distill.memory` prints them)."""
    sections = (
        ("Llama-3.1-8B → Llama-3.2-1B", paper_runs(LLAMA_1B, LLAMA_8B)),
        ("Qwen2.5-7B → Qwen2.5-1.5B", paper_runs(QWEN_1_5B, QWEN_7B)),
        (
            "GRPO on 1 GPU (grpo_llama.yaml, grpo_qwen.yaml; the reference is the starting policy)",
            grpo_runs(),
        ),
        (
            "Llama-3.1-8B → Llama-3.2-1B on 1 GPU of 80 GiB with `data.engine: vllm` (docs/vllm.md)",
            vllm_runs(),
        ),
    )
    return "\n\n".join(f"{title}:\n\n{table(runs)}" for title, runs in sections) + "\n"


if __name__ == "__main__":
    print(readme_tables(), end="")

"""Distillation step time: distill vs TRL's GKD trainer vs a bare PyTorch loop, on- and off-policy.

Run:  .venv/bin/python benchmarks/step.py                 # make bench-step; TRL: pip install -e .[bench]
      .venv/bin/python benchmarks/step.py --rounds 3 --steps 8

Every contender trains the same tiny-world student against the same frozen teacher on batches of
`--batch` Countdown-3 prompts (the same distribution of prompts; distill draws its own batches from
its training split, the others take `countdown.generate`'s): it samples completions (up to `--new-tokens` at temperature 1, no
top-k/top-p, rows stopping at EOS), scores them with both models, takes the per-token forward
KL(teacher||student) over the completion tokens, backpropagates, clips the gradient norm at 1.0 and
steps AdamW (lr `--lr`, no weight decay). On-policy the student writes the completions; off-policy
the teacher writes fresh ones every step (no rollout cache). Contenders:

- distill:      `DistillationModule` + `RolloutDataModule` (data.mix 0 / 1) under a Lightning
                `Trainer` with no logger, checkpointing or evaluation (`distill fit` without its
                measurement callbacks);
- distill-compiled: the same with `model.execution.compile_decoding` (static KV cache, `torch.compile`d
                decode step for both models) and `model.execution.compile_forwards` (both models' scoring
                and training passes compiled with dynamic shapes); the compiles fall in the dropped
                warm-up steps, and the median is robust to a later recompile on a new prompt width;
- trl:          `trl.experimental.gkd.GKDTrainer`, lmbda 1 on-policy / lmbda 0 with seq_kd
                off-policy, beta 0 (forward KL), gradient checkpointing off (a well-configured
                TRL: with it on, `generate` also runs without a KV cache);
- trl-defaults: the same at GKDConfig's defaults for everything the comparison does not fix
                (gradient checkpointing on), on-policy only;
- bare:         a plain loop: `generate(do_sample=True)`, both forwards over the whole sequence,
                `log_softmax` / `kl_div` over the vocabulary, `clip_grad_norm_`, `AdamW.step`.

TRL's GKD refuses a student and teacher whose configs' vocab sizes differ, so both models are first
cut to the tokenizer's real tokens (`resize_token_embeddings`) and saved; every contender loads the
cut copies. Each round trains every contender afresh for `--steps` steps, interleaved
(distill, trl, bare, distill, ...) so that load from other jobs falls on all alike; a step's time is
the wall time between consecutive step ends (rollout, both forwards, loss, backward, clip, update;
the first `--warmup` steps of each run are dropped). Reported: per contender the median over rounds
of each run's median step time, the completion tokens per row (must agree: equal lengths are what
makes the step times comparable), and the ratios to distill. Contenders whose package is missing
(TRL) are skipped with a note.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.tiny_world_names import default_dir
from distill.tasks import countdown

EOS, PAD = 2, 0


def cut_models(world: Path, dest: Path) -> tuple[Path, Path]:
    """Copies of the world's student and teacher with exactly the tokenizer's rows (TRL needs equal
    vocab sizes); returns their directories."""
    tokenizer = AutoTokenizer.from_pretrained(world / "student")
    paths = []
    for name in ("student", "teacher"):
        model = AutoModelForCausalLM.from_pretrained(world / name)
        model.resize_token_embeddings(len(tokenizer))
        model.save_pretrained(dest / name)
        tokenizer.save_pretrained(dest / name)
        paths.append(dest / name)
    return paths[0], paths[1]


def prompts(n: int, seed: int) -> list[str]:
    return [countdown.prompt(*p) for p in countdown.generate(n, seed=seed)]


def step_seconds(ends: list[float], warmup: int) -> float:
    """Median of the intervals between consecutive step ends, the first `warmup` steps dropped."""
    gaps = [b - a for a, b in zip(ends[warmup:], ends[warmup + 1 :])]
    return statistics.median(gaps)


def completion_mask(generated: torch.Tensor) -> torch.Tensor:
    """True up to and including each row's first EOS."""
    hit = (generated == EOS).long()
    return (hit.cumsum(1) - hit) == 0


# --- contenders: each returns (median step seconds, completion tokens per row) ----------------------


def run_distill(
    paths, off_policy: bool, args, seed: int, compiled: bool = False, phases=None
) -> tuple[float, float]:
    import lightning as L

    from distill.data import RolloutDataModule
    from distill.losses import ForwardKL
    from distill.module import DistillationModule

    ends, tokens = [], []
    if compiled:  # fresh models: drop the previous runs' compiled code (dynamo's recompile limit)
        torch._dynamo.reset()

    class Timer(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            ends.append(time.perf_counter())
            tokens.append(float(batch["rollout"].completion_mask.sum()) / batch["rollout"].input_ids.shape[0])
            if phases is not None and len(ends) > args.warmup + 1:  # the steps that are timed
                step = outputs["step"]
                phases.append(
                    {
                        "rollout": step.rollout.rollout_seconds,
                        "teacher forward": step.cost.teacher_forward_s,
                        "student fwd+bwd+update": step.cost.student_forward_backward_s,
                        "step": ends[-1] - ends[-2],
                    }
                )

    module = DistillationModule(
        student=str(paths[0]),
        teacher=str(paths[1]),
        divergence=ForwardKL(),
        optimizer=partial(torch.optim.AdamW, lr=args.lr, weight_decay=0.0),
        gradient_clip_val=1.0,
        text_log={"every": 0}, execution={"compile_decoding": compiled, "compile_forwards": compiled},
    )
    data = RolloutDataModule(
        task="countdown3",
        mix=1.0 if off_policy else 0.0,
        batch_size=args.batch,
        sampling={"max_new_tokens": args.new_tokens}, evaluation={"val_size": 0, "test_size": 0},
        train_size=args.batch * (args.steps + 1),
        seed=seed,
    )
    L.seed_everything(seed, verbose=False)
    cuda = getattr(args, "device", "cpu") == "cuda"  # on a GPU: bf16 autocast, as the paper configs
    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu",
        precision="bf16-mixed" if cuda else "32-true",
        devices=1,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[Timer()],
    )
    trainer.fit(module, data)
    if compiled:  # a failed compile runs eagerly (a warning, silenced here): say so
        from distill.models.compiled import compiled_forward
        from distill.rollout.compiled import compiled_step

        for role in ("student", "teacher"):
            for what, marked in (("decoding", compiled_step), ("forward passes", compiled_forward)):
                failed = marked(getattr(module, role)).failed
                if failed:
                    print(f"note: the {role}'s compiled {what} fell back to eager ({failed})")
    return step_seconds(ends, args.warmup), statistics.mean(tokens[args.warmup :])


def run_bare(paths, off_policy: bool, args, seed: int, phases=None) -> tuple[float, float]:
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(paths[0], padding_side="left")
    student = AutoModelForCausalLM.from_pretrained(paths[0])
    teacher = AutoModelForCausalLM.from_pretrained(paths[1]).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=0.0)
    texts = prompts(args.batch * args.steps, seed)
    ends, tokens = [], []
    for step in range(args.steps):
        enc = tokenizer(
            texts[step * args.batch : (step + 1) * args.batch],
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
        )
        writer = teacher if off_policy else student
        t0 = time.perf_counter()
        student.eval()
        with torch.no_grad():
            out = writer.generate(
                enc.input_ids,
                attention_mask=enc.attention_mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.new_tokens,
                eos_token_id=EOS,
                pad_token_id=PAD,
            )
        student.train()
        t1 = time.perf_counter()
        p = enc.input_ids.shape[1]
        written = completion_mask(out[:, p:])
        mask = torch.cat([enc.attention_mask, written.long()], dim=1)
        with torch.no_grad():
            t_logits = teacher(input_ids=out, attention_mask=mask).logits[:, p - 1 : -1]
        t2 = time.perf_counter()
        s_logits = student(input_ids=out, attention_mask=mask).logits[:, p - 1 : -1]
        kl = F.kl_div(s_logits.log_softmax(-1), t_logits.log_softmax(-1), reduction="none", log_target=True)
        loss = kl.sum(-1)[written].mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
        tokens.append(float(written.sum()) / args.batch)
        if phases is not None and len(ends) > args.warmup + 1:
            phases.append(
                {
                    "rollout": t1 - t0,
                    "teacher forward": t2 - t1,
                    "student fwd+bwd+update": ends[-1] - t2,
                    "step": ends[-1] - ends[-2],
                }
            )
    return step_seconds(ends, args.warmup), statistics.mean(tokens[args.warmup :])


def run_trl(paths, off_policy: bool, args, seed: int, defaults: bool = False) -> tuple[float, float]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    tokenizer = AutoTokenizer.from_pretrained(paths[0], padding_side="left")
    ends, tokens = [], []

    def collate(rows):
        enc = tokenizer(
            [r["prompt"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False
        )
        labels = enc.input_ids.clone()  # replaced by the generated completion's labels every step
        return {
            "prompts": enc.input_ids,
            "prompt_attention_mask": enc.attention_mask,
            "input_ids": enc.input_ids,
            "attention_mask": enc.attention_mask,
            "labels": labels,
        }

    class Timer(TrainerCallback):
        def on_step_end(self, targs, state, control, **kwargs):
            ends.append(time.perf_counter())

    class Counting(GKDTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            # None: GKD then divides by the generated completion tokens (a per-token mean, as
            # distill and the bare loop take); the Trainer's count came from the collated prompts.
            loss = super().training_step(model, inputs, None)
            labels = inputs["labels"][:, 1:]
            tokens.append(float((labels != -100).sum()) / labels.shape[0])
            return loss

    fixed = dict(
        output_dir=args.scratch,
        per_device_train_batch_size=args.batch,
        max_steps=args.steps,
        learning_rate=args.lr,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        optim="adamw_torch",
        lmbda=0.0 if off_policy else 1.0,
        seq_kd=off_policy,
        beta=0.0,
        temperature=1.0,
        max_new_tokens=args.new_tokens,
        use_cpu=getattr(args, "device", "cpu") == "cpu",
        # SFTConfig's default is bf16 autocast; distill and the bare loop run float32 on the CPU
        bf16=getattr(args, "device", "cpu") == "cuda",
        seed=seed,
        report_to=[],
        save_strategy="no",
        logging_steps=10**6,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if not defaults:
        fixed["gradient_checkpointing"] = False
    config = GKDConfig(**fixed)
    student = AutoModelForCausalLM.from_pretrained(paths[0])
    teacher = AutoModelForCausalLM.from_pretrained(paths[1])
    for model in (student, teacher):
        model.generation_config.eos_token_id = EOS
        model.generation_config.pad_token_id = PAD
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Counting(
            model=student,
            teacher_model=teacher,
            args=config,
            data_collator=collate,
            train_dataset=Dataset.from_dict({"prompt": prompts(args.batch * args.steps, seed)}),
            processing_class=tokenizer,
            callbacks=[Timer()],
        )
        trainer.train()
    return step_seconds(ends, args.warmup), statistics.mean(tokens[args.warmup :])


def print_profile(profile: dict[str, list[dict]]) -> None:
    """Median seconds per phase of the timed steps (pooled over rounds); `other` is the rest of the
    step: the loss's statistics, clipping, Lightning's loop, the data pipeline."""
    names = ("rollout", "teacher forward", "student fwd+bwd+update")
    print(f"where a step goes (median s): {' | '.join(names)} | other | step")
    for contender, steps in profile.items():
        if not steps:
            continue
        medians = [statistics.median(p[n] for p in steps) for n in names]
        step = statistics.median(p["step"] for p in steps)
        other = statistics.median(p["step"] - sum(p[n] for n in names) for p in steps)
        print(
            f"  {contender:<17} " + " | ".join(f"{m:.3f}" for m in medians) + f" | {other:.3f} | {step:.3f}"
        )


def have_trl() -> bool:
    try:
        import trl.experimental.gkd  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--world",
        type=Path,
        default=default_dir("v2"),
        help="a tiny world's folder (default: v2's, `distill tiny-world --version v2`: RESULTS.md's figures)",
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--steps", type=int, default=12, help="optimiser steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of each run")
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds (a run of every contender each)"
    )
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=["on", "off"], help="one policy only")
    args = parser.parse_args()
    if args.steps < args.warmup + 2:
        parser.error(f"--steps must be at least --warmup + 2 = {args.warmup + 2} (two timed step ends)")
    load_avg = os.getloadavg()
    print(f"load average before (1/5/15 min): {load_avg[0]:.2f} {load_avg[1]:.2f} {load_avg[2]:.2f}")
    if load_avg[0] > 0.5:
        print("warning: load average > 0.5, the machine is shared: ratios are noisier than usual")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trl = have_trl()
    if not trl:
        print("TRL is not installed (pip install -e .[bench]): its contenders are skipped")
    import logging

    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    policies = [p for p in ("on", "off") if args.only in (None, p)]
    with tempfile.TemporaryDirectory() as tmp:
        args.scratch = str(Path(tmp) / "trl")
        paths = cut_models(args.world, Path(tmp))
        print(
            f"torch {torch.__version__}, {torch.get_num_threads()} threads; B={args.batch}, up to "
            f"{args.new_tokens} new tokens, {args.steps} steps per run ({args.warmup} dropped), "
            f"{args.rounds} rounds, vocabulary cut to {len(AutoTokenizer.from_pretrained(paths[0]))} tokens"
        )
        for policy in policies:
            off = policy == "off"
            profile = {name: [] for name in ("distill", "distill-compiled", "bare")}
            contenders = {
                "distill": partial(run_distill, phases=profile["distill"]),
                "distill-compiled": partial(run_distill, compiled=True, phases=profile["distill-compiled"]),
                "bare": partial(run_bare, phases=profile["bare"]),
            }
            if trl:
                contenders["trl"] = run_trl
                if not off:
                    contenders["trl-defaults"] = partial(run_trl, defaults=True)
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
            for r in range(args.rounds):
                for name, run in contenders.items():
                    runs[name].append(run(paths, off, args, seed=r))
            print(
                f"\n{policy}-policy ({'the teacher' if off else 'the student'} writes), medians of {args.rounds} runs:"
            )
            print(f"{'contender':<17} {'s/step':>7} {'tokens/row':>11} {'x distill':>10}")
            base = statistics.median(s for s, _ in runs["distill"])
            for name, rs in runs.items():
                seconds = statistics.median(s for s, _ in rs)
                length = statistics.median(t for _, t in rs)
                print(f"{name:<17} {seconds:>7.3f} {length:>11.1f} {seconds / base:>10.2f}")
            lengths = [statistics.median(t for _, t in rs) for rs in runs.values()]
            spread = max(lengths) / min(lengths) - 1
            verdict = "equal enough" if spread <= 0.15 else "NOT comparable: lengths differ by more than 15%"
            print(f"completion lengths: spread {100 * spread:.0f}% ({verdict})")
            if "trl" in runs:
                trl_s = statistics.median(s for s, _ in runs["trl"])
                print(f"distill / trl (well configured): {base / trl_s:.2f}  (target <= 0.75)")
            bare_s = statistics.median(s for s, _ in runs["bare"])
            print(f"distill / bare loop:             {base / bare_s:.2f}  (target <= 0.90)")
            fast = statistics.median(s for s, _ in runs["distill-compiled"])
            if "trl" in runs:
                print(f"distill-compiled / trl:          {fast / trl_s:.2f}")
            print(f"distill-compiled / bare loop:    {fast / bare_s:.2f}")
            print_profile(profile)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

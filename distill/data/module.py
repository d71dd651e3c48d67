"""`RolloutDataModule`: task prompts in, rollout batches out.

The DataModule owns rollout sampling: its dataloaders yield tokenised prompt batches, and
`on_after_batch_transfer` turns each one — on the device, with the current student — into a
`RolloutBatch` written by the student/teacher mixture (training) or by the student alone, greedily
(validation and test). Each batch seen by the LightningModule is a dict
``{"rollout": RolloutBatch, "rows": [task rows], "task": name}``; training batches also carry
``"group_size"`` (consecutive rows that share a prompt, `data.group_size`) and ``"temperature"``
(the sampling temperature that wrote them, which GRPO's probability ratios need).

Under data parallelism each rank draws its own shard of prompts: training batches from
`order.ResumableShuffle` (the ranks' k-th batches together are the single-process k-th batch of
batch_size x ranks), evaluation prompts split without repeats into equally many batches on every
rank (`order.EvenBatches`), so the validation and test figures, summed over ranks by
`distill.training.EvalFigures`, count every prompt once.

A LightningModule without a teacher (`teacher` None, e.g. `distill.rl.GRPOModule`) works with
`mix` 0 and a granularity other than `speculative`: the student then writes every rollout.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import lightning as L
import torch
import torch.distributed as dist
from datasets import Dataset
from torch.utils.data import DataLoader

from distill.checks import check_int, settings
from distill.data.order import EvenBatches, ResumableShuffle, RowLists
from distill.data.prompts import PromptCollator, render_context, repeat_rows
from distill.models.loading import load_tokenizer
from distill.precision import step_precision
from distill.rollout import RolloutBatch, RolloutSampler
from distill.rollout.vllm_engine import VLLMSettings
from distill.seeds import path_seed
from distill.tasks.qa_datasets import row_metrics
from distill.tasks.registry import get_task

# Lightning cannot see that the training loader resumes mid-epoch (the DataModule's state restores
# its position, `ResumableShuffle`), so it warns on every such resume; the warning is wrong here.
warnings.filterwarnings("ignore", message=r".*resuming from a checkpoint that ended before the epoch ended.*")


def _rows(task, n: int, seed: int, part: str) -> list[dict]:
    """A split's rows: generated tasks draw them from the split's seed; dataset tasks (`parts`) from
    their fixed, disjoint train/val/test parts."""
    if hasattr(task, "parts"):
        return task.rows(n, seed, part=part)
    return task.rows(n, seed=seed)


def _eval_budgets(value, tasks) -> dict[str, int]:
    """`data.evaluation.max_new_tokens` as a budget per evaluated task: one integer for all, or a mapping
    that names every task (a longer task needs a longer budget; a short one should not pay for it)."""
    names = list(dict.fromkeys(t.name for t in tasks))
    if not isinstance(value, dict):
        n = check_int("data.evaluation.max_new_tokens", value, 1)
        return dict.fromkeys(names, n) or {"": n}
    if not value:
        raise ValueError(
            "data.evaluation.max_new_tokens must be an integer >= 1 or a non-empty {task: budget} mapping"
        )
    budgets = {str(k): check_int(f"data.evaluation.max_new_tokens.{k}", v, 1) for k, v in value.items()}
    missing = [n for n in names if n not in budgets]
    if missing:
        raise ValueError(
            f"data.evaluation.max_new_tokens names no budget for the evaluated task(s) {missing}; "
            f"it names {sorted(budgets)}: give every validation and test task a budget"
        )
    return budgets


@dataclass(frozen=True)
class Sampling:
    """How training rollouts are decoded (evaluation decodes greedily, at `Evaluation`'s budgets).

    Args:
        max_new_tokens: completion budget of training rollouts.
        temperature: sampling temperature of training rollouts (0 = greedy).
        top_k: keep only the k most likely tokens when sampling (None = off).
        top_p: nucleus sampling threshold in (0, 1] (None = off).
        speculative_top_k: with granularity `speculative`, student proposals outside the teacher's
            top-k are replaced by teacher samples.
    """

    max_new_tokens: int = 96
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    speculative_top_k: int = 5


@dataclass(frozen=True)
class PromptFormat:
    """How a task row becomes each model's prompt tokens (`distill.data.prompts.PromptCollator`).

    Args:
        tokenizer: tokenizer path; None takes the LightningModule's (`model.student`'s) tokenizer.
        chat_template: wrap prompts in the tokenizer's chat template (instruct hub models).
        chat_template_kwargs: extra variables for the chat template, e.g. `{date_string: 26 Jul 2024}`
            for Llama-3.x, whose template otherwise stamps today's date into every prompt (so that
            prompts, and the teacher-rollout cache keys, would change from day to day).
        teacher_context: text only the teacher reads (None = it reads the student's prompt): a
            system message with a chat template, else text put before the prompt; a `str.format`
            template over the row's fields, e.g. `"Background: {reasoning}\n"` for privileged
            context. The teacher writes its rollouts and scores every completion after its own
            prompt; both models are aligned on the completion tokens.
        student_context: the same for the student's own prompt (None = unchanged). Rarely set by
            hand: a sweep's teacher reference uses it to test the teacher, in the student's place,
            with the `teacher_context` it reads in training.
    """

    tokenizer: str | None = None
    chat_template: bool = False
    chat_template_kwargs: dict | None = None
    teacher_context: str | None = None
    student_context: str | None = None


@dataclass(frozen=True)
class Evaluation:
    """The validation and test prompts and their greedy decoding.

    Args:
        val_tasks: tasks evaluated during validation (greedy accuracy, logged per task); None =
            the training task.
        test_tasks: tasks evaluated by `test` (e.g. the training task and its harder variants);
            None = the training task.
        val_size: prompts per validation task (>= 0).
        test_size: prompts per test task (>= 0).
        batch_size: prompts per evaluation batch.
        max_new_tokens: completion budget of evaluation generations: one for every task, or a
            budget per task (`{countdown3: 96, countdown_chain: 192}`), which must then name every
            validation and test task (`RolloutDataModule.eval_budget`).
    """

    val_tasks: list[str] | None = None
    test_tasks: list[str] | None = None
    val_size: int = 200
    test_size: int = 500
    batch_size: int = 100
    max_new_tokens: int | dict[str, int] = 128

    def __post_init__(self) -> None:
        check_int("data.evaluation.batch_size", self.batch_size, 1)
        for name in ("val_size", "test_size"):
            check_int(f"data.evaluation.{name}", getattr(self, name), 0)


# The rollout policy's own settings; the rest of the sampler's are `Sampling`'s.
POLICY_SETTINGS = ("mix", "granularity", "engine")
GROUPS = {"sampling": Sampling, "prompts": PromptFormat, "evaluation": Evaluation, "vllm": VLLMSettings}


class RolloutDataModule(L.LightningDataModule):
    """Prompts of a task and the rollout-policy knob.

    Args:
        task: training task (e.g. `countdown3`; see `distill.tasks.registry.TASKS`), or a dataset
            spec such as `sciq:path/to/sciq.jsonl` (see `distill.tasks.qa_datasets`).
        mix: the teacher's share of the rollouts, in [0, 1] (0 = on-policy student, 1 = teacher).
        granularity: how the share is applied: `batch`, `sequence`, `token` or `speculative`.
        refresh_every: how many optimiser steps a batch of rollouts is reused (1 = always fresh,
            fully on-policy; larger values make student rollouts stale).
        batch_size: prompts per optimiser step on each device (sequences, with group_size 1).
        group_size: completions sampled per training prompt (G, >= 1): each prompt of a batch is
            repeated G times (consecutive rows, `rows` repeated to match) before rollout sampling,
            so a step holds batch_size x G sequences. GRPO needs G >= 2; distillation uses 1.
        train_size: number of training prompts (one epoch).
        rollout_cache: folder caching teacher-written rollouts across runs (None: env
            `DISTILL_ROLLOUT_CACHE`, or no cache).
        seed: data seed (prompt generation and order, rollout sampling); linked to `seed_everything`.
        sampling: how training rollouts are decoded (`Sampling`).
        prompts: how rows become prompts: tokenizer, chat template, teacher-only context (`PromptFormat`).
        evaluation: the validation and test tasks, sizes, batch and budgets (`Evaluation`).
        engine: who writes the training rollouts' rows: `native` (distill's decoder; every
            granularity) or `vllm` (a vLLM engine per model, the student's loaded with its current
            weights; granularity batch or sequence). Evaluation and the measurement callbacks decode
            natively, greedily, with either.
        vllm: the vLLM engines' settings (`distill.rollout.vllm_engine.VLLMSettings`).
    """

    def __init__(
        self,
        task: str = "countdown3",
        mix: float = 0.0,
        granularity: str = "sequence",
        refresh_every: int = 1,
        batch_size: int = 16,
        group_size: int = 1,
        train_size: int = 20000,
        rollout_cache: str | None = None,
        seed: int = 0,
        sampling: Sampling = Sampling(),
        prompts: PromptFormat = PromptFormat(),
        evaluation: Evaluation = Evaluation(),
        engine: str = "native",
        vllm: VLLMSettings = VLLMSettings(),
    ):
        super().__init__()
        self.sampling = settings(Sampling, sampling, "data.sampling")
        self.prompts = settings(PromptFormat, prompts, "data.prompts")
        self.evaluation = settings(Evaluation, evaluation, "data.evaluation")
        self.vllm = settings(VLLMSettings, vllm, "data.vllm")
        self.save_hyperparameters(ignore=list(GROUPS))
        # Plain mappings in the hyper-parameters (and so in checkpoints), read back by `settings`.
        self.hparams.update({name: dataclasses.asdict(getattr(self, name)) for name in GROUPS})
        for name in ("refresh_every", "batch_size", "group_size", "train_size"):
            check_int(f"data.{name}", getattr(self.hparams, name), 1)
        self.task = get_task(task, "data.task")
        ev, fmt = self.evaluation, self.prompts
        self.val_tasks = [
            get_task(t, "data.evaluation.val_tasks")
            for t in (ev.val_tasks if ev.val_tasks is not None else [task])
        ]
        self.test_tasks = [
            get_task(t, "data.evaluation.test_tasks")
            for t in (ev.test_tasks if ev.test_tasks is not None else [task])
        ]
        # A malformed template fails now, before any model is loaded, and so does one that reads a
        # field some task's rows lack (a row of each task and split shows their fields).
        PromptCollator(None, fmt.chat_template, fmt.chat_template_kwargs, fmt.teacher_context, fmt.student_context)
        parts = [(self.task, "train"), *((t, "val") for t in self.val_tasks)]
        parts += [(t, "test") for t in self.test_tasks]
        contexts = (("teacher_context", fmt.teacher_context), ("student_context", fmt.student_context))
        for owner, context in contexts:
            for t, part in parts if context is not None else ():
                for row in _rows(t, 1, path_seed(part), part)[:1]:
                    render_context(context, row, f"data.prompts.{owner} (task {t.name})")
        try:  # the sampler validates the knob's settings now, before any model is loaded
            self.sampler = RolloutSampler(
                mix=mix,
                granularity=granularity,
                cache_dir=rollout_cache,
                engine=engine,
                vllm=self.vllm,
                **dataclasses.asdict(self.sampling),
            )
        except ValueError as err:
            group = "data." if str(err).split(" ")[0] in POLICY_SETTINGS else "data.sampling."
            raise ValueError(f"{group}{err}") from None
        self.eval_budgets = _eval_budgets(ev.max_new_tokens, self.val_tasks + self.test_tasks)
        self.eval_samplers = {  # one greedy sampler per budget
            n: RolloutSampler(mix=0.0, granularity="sequence", max_new_tokens=n, temperature=0.0)
            for n in sorted(set(self.eval_budgets.values()))
        }
        self.tokenizer = None
        self._reuse: tuple[int, dict] | None = None
        # Where training stands, for exact resume: the epoch and the prompt batches consumed in it
        # (counted when a batch is turned into rollouts, so a batch the loop only prefetched is not).
        self._position = {"epoch": 0, "batches": 0}
        self._resume_from: dict | None = None  # a checkpoint's position, for the next train loader

    # --- datasets ---------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.tokenizer is None:
            path = self.prompts.tokenizer
            self.tokenizer = load_tokenizer(path) if path else self.trainer.lightning_module.tokenizer
        fmt, ev = self.prompts, self.evaluation
        self.collate = PromptCollator(
            self.tokenizer, fmt.chat_template, fmt.chat_template_kwargs, fmt.teacher_context, fmt.student_context
        )
        # Never sample the padded embedding rows past the tokenizer: they are not tokens.
        self.sampler.use_tokenizer(self.tokenizer)
        for sampler in self.eval_samplers.values():
            sampler.use_tokenizer(self.tokenizer)
        seed, h = self.hparams.seed, self.hparams
        world, _ = self._ranks()
        for name in ("val_size", "test_size"):  # a rank without prompts would miss the figures' sync
            if 0 < getattr(ev, name) < world:
                raise ValueError(
                    f"data.evaluation.{name} must be 0 or at least the number of ranks ({world}), "
                    f"got {getattr(ev, name)}"
                )
        # Split seeds are disjoint: training prompts never come from the evaluation generators.
        if stage == "fit":
            self.train_set = Dataset.from_list(
                _rows(self.task, h.train_size, path_seed("train", seed), "train")
            )
        if stage in ("fit", "validate"):
            self.val_sets = [
                Dataset.from_list(_rows(t, ev.val_size, path_seed("val"), "val")) for t in self.val_tasks
            ]
        if stage == "test":
            self.test_sets = [
                Dataset.from_list(_rows(t, ev.test_size, path_seed("test"), "test")) for t in self.test_tasks
            ]
        # A context template naming a field the rows lack fails here, before any model is loaded.
        contexts = fmt.teacher_context is not None or fmt.student_context is not None
        for name in ("train_set", "val_sets", "test_sets") if contexts else ():
            found = getattr(self, name, None)
            for dataset in [found] if isinstance(found, Dataset) else found or []:
                if len(dataset):
                    self.collate([dataset[0]])
        # QA rows that cannot be scored, per task and split (`qa_datasets.row_metrics`), logged once.
        loggers = getattr(self.trainer, "loggers", None) or []
        if loggers and not getattr(self, "_rows_logged", False):
            self._rows_logged = True
            counts = row_metrics([self.task, *self.val_tasks, *self.test_tasks])
            for logger in loggers if counts else []:
                logger.log_metrics(counts, step=0)

    def _ranks(self) -> tuple[int, int]:
        """(world size, this rank) of the attached Trainer; (1, 0) without one (or a stand-in without them)."""
        return getattr(self.trainer, "world_size", 1), getattr(self.trainer, "global_rank", 0)

    def _loader(self, dataset, batch_size: int) -> DataLoader:
        world, rank = self._ranks()
        if world == 1:
            return DataLoader(dataset, batch_size=batch_size, collate_fn=self.collate)
        batches = EvenBatches(len(dataset), batch_size, world, rank)
        return DataLoader(RowLists(dataset), batch_size=None, sampler=batches, collate_fn=self.collate)

    def train_dataloader(self):
        world, rank = self._ranks()
        shuffle = ResumableShuffle(len(self.train_set), path_seed("order", self.hparams.seed), world, rank)
        if self._resume_from is not None:  # restored from a checkpoint: start where it stood
            position, self._resume_from = self._resume_from, None
            shuffle.resume(position["epoch"], position["batches"] * self.hparams.batch_size)
        return DataLoader(
            self.train_set,
            batch_size=self.hparams.batch_size,
            sampler=shuffle,
            collate_fn=self.collate,
            drop_last=True,
        )

    def val_dataloader(self):
        return [self._loader(d, self.evaluation.batch_size) for d in self.val_sets]

    def test_dataloader(self):
        return [self._loader(d, self.evaluation.batch_size) for d in self.test_sets]

    def teardown(self, stage: str) -> None:
        if stage == "fit" and self.sampler.engines is not None:  # end the engines' processes
            self.sampler.engines.close()

    # --- resume -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Saved in every checkpoint: the data position and, while `refresh_every` > 1 reuses a
        rollout batch, that batch (its student weights are gone, so it cannot be re-sampled).
        Under data parallelism each rank reuses its own batch: every rank's is gathered to rank 0,
        which writes the checkpoint (`reuse_by_rank`; a collective every rank enters)."""
        reuse = None
        if self._reuse is not None:
            step, out = self._reuse
            reuse = {
                "step": step,
                "rollout": dataclasses.asdict(out["rollout"].to("cpu")),
                "rows": out["rows"],
            }
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return {"position": dict(self._position), "reuse": reuse}
        by_rank = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(reuse, by_rank, dst=0)  # rank 0 writes the checkpoint
        return {"position": dict(self._position), "reuse": None, "reuse_by_rank": by_rank}

    def load_state_dict(self, state_dict: dict) -> None:
        self._position = dict(state_dict["position"])
        self._resume_from = dict(self._position)
        reuse = state_dict.get("reuse")
        by_rank = state_dict.get("reuse_by_rank")
        world, rank = self._ranks()
        if by_rank is not None and len(by_rank) == world:
            reuse = by_rank[rank]
        elif world > 1 or by_rank is not None:
            kept = by_rank if by_rank is not None else [reuse]
            if any(r is not None for r in kept):  # a batch to reuse that this layout cannot place
                raise ValueError(
                    f"the checkpoint holds rollout batches of {len(kept)} rank(s) for reuse "
                    f"(data.refresh_every {self.hparams.refresh_every}); resume it on {len(kept)} "
                    f"device(s), not {world} (a checkpoint of several ranks written before each "
                    "rank's batch was saved holds rank 0's only: it cannot resume exactly)"
                )
            reuse = None
        self._reuse = None
        if reuse is not None:
            out = {
                "rollout": RolloutBatch(**reuse["rollout"]),
                "rows": reuse["rows"],
                "task": self.task.name,
                "group_size": self.hparams.group_size,
                "temperature": self.sampler.temperature,
            }
            self._reuse = (reuse["step"], out)

    # --- rollouts ---------------------------------------------------------------------------------
    def on_after_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        # Rollouts are sampled under the step's precision (autocast under `*-mixed`): the policy
        # that writes them is the policy the step trains (`distill.precision`).
        with step_precision(self.trainer):
            return self._rollouts(batch, dataloader_idx)

    def _rollouts(self, batch: dict, dataloader_idx: int) -> dict:
        trainer = self.trainer
        module = trainer.lightning_module
        if trainer.training:
            epoch = trainer.current_epoch
            done = self._position["batches"] if self._position["epoch"] == epoch else 0
            self._position = {"epoch": epoch, "batches": done + 1}
            step = trainer.global_step
            if self._reuse is not None and step - self._reuse[0] < self.hparams.refresh_every:
                rollout = self._reuse[1]["rollout"].to(batch["input_ids"].device)
                return {**self._reuse[1], "rollout": rollout, "reused": True}
            g = self.hparams.group_size
            # The per-row sampling streams differ by occurrence, so a group's rows differ.
            batch = repeat_rows(batch, g)
            rollout = self.sampler.sample(
                module.student,
                self._teacher(module, self.sampler),
                batch["input_ids"],
                batch["attention_mask"],
                generator=torch.Generator().manual_seed(path_seed("rollout", self.hparams.seed, step)),
                seed=self._rollout_seed(trainer.current_epoch),
                step=step,
                **self._teacher_prompt(batch),
            )
            if self.sampler.engines is not None:  # the step's memory back from the engines
                self.sampler.engines.sleep()
            out = {
                "rollout": rollout,
                "rows": batch["rows"],
                "task": self.task.name,
                "group_size": g,
                "temperature": self.sampler.temperature,
            }
            self._reuse = (step, out) if self.hparams.refresh_every > 1 else None
            return {**out, "reused": False}
        task = (self.test_tasks if trainer.testing else self.val_tasks)[dataloader_idx]
        sampler = self.eval_samplers[self.eval_budget(task.name)]
        rollout = sampler.sample(
            module.student,
            self._teacher(module, sampler),
            batch["input_ids"],
            batch["attention_mask"],
            **self._teacher_prompt(batch),
        )
        return {"rollout": rollout, "rows": batch["rows"], "task": task.name}

    def eval_budget(self, task: str) -> int:
        """The greedy budget of an evaluation of `task` (a task the mapping does not name, e.g. a
        callback's own, gets the largest)."""
        return self.eval_budgets.get(task, max(self.eval_budgets.values()))

    @staticmethod
    def _teacher_prompt(batch: dict) -> dict:
        """The sampler's teacher-only prompt arguments, when the batch has one."""
        if "teacher_input_ids" not in batch:
            return {}
        return {
            "teacher_input_ids": batch["teacher_input_ids"],
            "teacher_attention_mask": batch["teacher_attention_mask"],
        }

    def _rollout_seed(self, epoch: int) -> int:
        """Per-row sampling streams are seeded by (this, prompt, occurrence): a prompt met again in a
        later epoch must get fresh noise, or its rollouts repeat (GRPO then fits that noise)."""
        return self.hparams.seed if epoch == 0 else path_seed("rollout", self.hparams.seed, "epoch", epoch)

    @staticmethod
    def _teacher(module, sampler: RolloutSampler):
        """The module's teacher; for a module without one, the student, where the sampler never
        lets the teacher write (mix 0, not speculative)."""
        teacher = getattr(module, "teacher", None)
        if teacher is not None:
            return teacher
        if sampler.mix > 0 or sampler.granularity == "speculative":
            raise ValueError(
                f"data.mix={sampler.mix} with granularity {sampler.granularity!r} needs a teacher, but "
                f"{type(module).__name__} has none: use data.mix 0 with granularity batch, sequence or token"
            )
        return module.student

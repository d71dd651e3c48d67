"""`StyleProbe`: how much of the teacher's style the student's greedy (and sampled) outputs carry."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable

import lightning as L

from distill.callbacks.contract import StudentHolder, require
from distill.callbacks.generation import (
    eval_budget,
    log_scalars,
    rank_share,
    student_rollouts,
    summed_over_ranks,
    teacher_rollouts,
)
from distill.callbacks.interval import StepInterval
from distill.callbacks.options import check_tasks
from distill.checks import check_int
from distill.data.prompts import context_fields
from distill.parallel import gathered
from distill.rollout import RolloutSampler
from distill.tasks.countdown import STYLE_PATTERN
from distill.tasks.registry import get_task

ROWS_SEED = 4243  # probe prompts: fixed, so every evaluation reads the same problems


def style_share(texts: Iterable[str], detector: Callable[[str], bool]) -> float:
    """Fraction of `texts` for which `detector` is true (0.0 for no texts)."""
    flags = [bool(detector(t)) for t in texts]
    return sum(flags) / len(flags) if flags else 0.0


class RegexDetector:
    """True when `pattern` occurs in the text (a class, not a lambda, so the callback pickles)."""

    def __init__(self, pattern: str):
        self.regex = re.compile(pattern)

    def __call__(self, text: str) -> bool:
        return self.regex.search(text) is not None


def import_callable(path: str) -> Callable[[str], bool]:
    """`package.module.name` -> that callable."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(
            f"StyleProbe.detector must be a dotted import path like 'pkg.module.func', got {path!r}"
        )
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"StyleProbe.detector {path!r} cannot be imported: {err}") from None
    if not callable(found):
        raise ValueError(f"StyleProbe.detector {path!r} is not callable")
    return found


class StyleProbe(L.Callback):
    """Share of the student's greedy completions that show the teacher's style, logged as
    `style/teacher_style_share` before any update, every `every_n_steps` optimiser steps and at the
    end of fit. `summary()` gives the final share and the step-0 one
    (`style/teacher_style_share_start`). Before the first update it also measures the teacher's own
    share on the same prompts, the same way (`style/teacher_own_share`, `..._sampled`): what the
    student's share is read against, since a teacher need not write its style every time
    (`distill.experiments.run.records.adoption_step`).

    Args:
        pattern: a regular expression searched in each completion (default: Countdown's teacher
            connectives, `distill.tasks.countdown.STYLE_PATTERN`), or, from Python, a callable
            (str) -> bool.
        detector: dotted import path of a callable (str) -> bool (e.g. `mypkg.style.is_teacher`);
            when given it replaces `pattern` (the way to pass a function from YAML).
        task: task whose prompts are used (registry name).
        num_prompts: prompts (fixed rows, the same at every evaluation).
        every_n_steps: evaluate every N optimiser steps (plus step 0 and the end).
        max_new_tokens: greedy completion budget; None: the datamodule's `evaluation.max_new_tokens`
            (else 128).
        batch_size: prompts per generation call.
        samples: also draw this many completions per prompt at temperature 1 (seeded: the same
            draws at every probe) and log their share as `style/teacher_style_share_sampled`, an
            estimate of the student's probability of writing the style. The greedy share is a
            0/1 switch per prompt (it flips when that probability passes the other choices');
            the sampled share grades the adoption. 0: greedy only.
    """

    def __init__(
        self,
        pattern: str | Callable[[str], bool] = STYLE_PATTERN,
        detector: str | None = None,
        task: str = "countdown3",
        num_prompts: int = 100,
        every_n_steps: int = 50,
        max_new_tokens: int | None = None,
        batch_size: int = 128,
        samples: int = 0,
    ):
        owner = "StyleProbe"
        if detector is not None:
            self.detector = import_callable(detector)
        elif isinstance(pattern, str):
            try:
                self.detector = RegexDetector(pattern)
            except re.error as err:
                raise ValueError(
                    f"{owner}.pattern {pattern!r} is not a valid regular expression: {err}"
                ) from None
        elif callable(pattern):
            self.detector = pattern
        else:
            raise ValueError(
                f"{owner}.pattern must be a regex string or a callable (str) -> bool, got {pattern!r}"
            )
        self.task = check_tasks(owner, "task", [task])[0]
        self.num_prompts = check_int(f"{owner}.num_prompts", num_prompts, 1)
        self.every_n_steps = check_int(f"{owner}.every_n_steps", every_n_steps, 1)
        self.interval = StepInterval(self.every_n_steps)
        self.max_new_tokens = check_int(f"{owner}.max_new_tokens", max_new_tokens, 1, optional=True)
        self.batch_size = check_int(f"{owner}.batch_size", batch_size, 1)
        self.samples = check_int(f"{owner}.samples", samples, 0)
        self.rows = get_task(self.task).rows(num_prompts, seed=ROWS_SEED)
        self.start: float | None = None
        self.latest: float | None = None
        self.latest_sampled: float | None = None
        self.teacher: dict[str, float] = {}  # the teacher's own shares, measured once
        self.last_step = -1

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        require(pl_module, StudentHolder, "StyleProbe")
        # The teacher reads its own context here as in training; one that fills in fields of the
        # training task's rows cannot be written for another task's. Said before the models load.
        prompts = getattr(getattr(trainer, "datamodule", None), "prompts", None)
        context = getattr(prompts, "teacher_context", None)
        if context is not None:
            missing = [f for f in context_fields(context) if f not in self.rows[0]]
            if missing:
                task = getattr(getattr(trainer, "datamodule", None), "hparams", {}).get("task")
                raise ValueError(
                    f"StyleProbe.task {self.task!r}: its rows lack {missing}, which "
                    f"data.prompts.teacher_context ({context!r}) reads, so the teacher cannot be "
                    f"probed on them; set StyleProbe's task to one whose rows have them"
                    + (f" (the training task, {task!r})" if task else "")
                )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.teacher:  # once; again after a checkpoint from before the teacher was measured
            self._measure_teacher(trainer, pl_module)
        if self.last_step < 0:  # the starting point; a resumed run measured it before its checkpoint
            self._measure(trainer, pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.interval.batch_start(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.interval.due_after(trainer):
            self._measure(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._measure(trainer, pl_module)

    def share(
        self, trainer, pl_module, temperature: float = 0.0, samples: int = 1, writer: str = "student"
    ) -> float:
        """The current share over the probe's prompts, greedy or over `samples` seeded draws per
        prompt at `temperature` (each rank rolls out its `rank_share`), of the student's completions
        or (`writer="teacher"`) the teacher's."""
        budget = self.max_new_tokens or eval_budget(trainer, self.task)
        teacher = writer == "teacher"
        sampler = RolloutSampler(mix=float(teacher), max_new_tokens=budget, temperature=temperature)
        rows = [row for row in self.rows for _ in range(samples)]
        seed = None if temperature == 0 else ROWS_SEED
        roll = teacher_rollouts if teacher else student_rollouts
        rollouts = roll(trainer, pl_module, rank_share(rows), sampler, self.batch_size, seed)
        texts = [t for r in rollouts for t in r.completions(pl_module.tokenizer)]
        hits = sum(bool(self.detector(t)) for t in texts)
        return summed_over_ranks([hits], pl_module.device)[0] / len(rows)

    def _measure_teacher(self, trainer, pl_module) -> None:
        if getattr(pl_module, "teacher", None) is None:
            return
        with gathered(pl_module.student, pl_module.teacher):  # one gather each, as in `_measure`
            self.teacher = {"style/teacher_own_share": self.share(trainer, pl_module, writer="teacher")}
            if self.samples:
                sampled = self.share(trainer, pl_module, 1.0, self.samples, writer="teacher")
                self.teacher["style/teacher_own_share_sampled"] = sampled
        log_scalars(trainer, self.teacher)

    def _measure(self, trainer, pl_module) -> None:
        if trainer.global_step == self.last_step:
            return
        self.last_step = trainer.global_step
        with gathered(pl_module.student):  # under FSDP: one gather for the whole measurement
            self.latest = self.share(trainer, pl_module)
            if self.samples:
                self.latest_sampled = self.share(trainer, pl_module, 1.0, self.samples)
        if self.start is None:
            self.start = self.latest
        figures = {"style/teacher_style_share": self.latest}
        if self.samples:
            figures["style/teacher_style_share_sampled"] = self.latest_sampled
        log_scalars(trainer, figures)

    def summary(self) -> dict[str, float]:
        if self.latest is None:
            return {}
        out = {"style/teacher_style_share": self.latest, "style/teacher_style_share_start": self.start}
        if self.latest_sampled is not None:
            out["style/teacher_style_share_sampled"] = self.latest_sampled
        return {**out, **self.teacher}

    def state_dict(self) -> dict:
        return {
            "start": self.start,
            "latest": self.latest,
            "latest_sampled": self.latest_sampled,
            "teacher": dict(self.teacher),
            "last_step": self.last_step,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.start, self.latest = state_dict["start"], state_dict["latest"]
        self.latest_sampled = state_dict.get("latest_sampled")  # checkpoints before it had none
        self.teacher = dict(state_dict.get("teacher", {}))
        self.last_step = int(state_dict["last_step"])

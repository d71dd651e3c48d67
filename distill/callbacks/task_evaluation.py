"""`TaskEvaluation`: coverage of the student's sampled answers (pass@k, distinct correct answers)
and its entropy along them, on the validation and test tasks."""

from __future__ import annotations

import lightning as L

from distill.callbacks.contract import StudentHolder, require
from distill.callbacks.generation import (
    eval_budget,
    evaluation_settings,
    next_token_logits,
    rank_share,
    student_rollouts,
    summed_over_ranks,
)
from distill.callbacks.options import check_tasks
from distill.checks import check, check_int, check_number, is_int
from distill.metrics.entropy import masked_sum_count, token_entropy
from distill.metrics.sampled_coverage import coverage_metrics
from distill.models.forward import completion_width
from distill.parallel import gathered
from distill.rollout import RolloutSampler
from distill.seeds import path_seed
from distill.tasks.registry import get_task

LOGIT_BUDGET = 1 << 26  # logit entries per entropy forward pass


class TaskEvaluation(L.Callback):
    """Sample `num_samples` completions per problem from the student alone and measure coverage.

    For each task and split, logs `<split>/<task>/pass@<k>` (mean over problems of the unbiased
    pass@k estimator, Chen et al. 2021), `<split>/<task>/distinct_correct` (mean number of distinct
    correct answers per problem, answers as the task extracts them) and
    `<split>/<task>/sample_entropy` (mean over the sampled completion tokens of the entropy, in
    nats, of the student's untempered next-token distribution; one extra student forward pass).
    Greedy accuracy is logged by the LightningModule itself (`<split>/<task>/accuracy`).
    Sampling uses a fixed seed, so successive evaluations of one student draw the same random
    numbers and differ only through the weights.

    Args:
        tasks: tasks to evaluate (registry names); None: the datamodule's `evaluation.val_tasks` at
            validation and its `evaluation.test_tasks` at test.
        num_problems: problems per task: the first ones of the datamodule's split for that task
            (the ones greedy accuracy uses), or generated from a fixed seed for a task the
            datamodule does not evaluate.
        num_samples: samples n per problem (>= every k).
        ks: the k of each pass@k, each in [1, num_samples].
        temperature: sampling temperature (> 0; no top-k/top-p filtering).
        max_new_tokens: completion budget; None: the datamodule's `evaluation.max_new_tokens` for the task
            (else 128).
        every_n_validations: evaluate at every N-th validation run of fit (sanity checks skipped).
        on_test: also evaluate at the end of `trainer.test`.
        batch_size: sequences per sampling call, rounded down to whole problems (at least one);
            None: the datamodule's `evaluation.batch_size` (else 256).
        seed: sampling seed.

    `summary()` returns the latest values of every key (the test values once test has run).
    """

    def __init__(
        self,
        tasks: list[str] | None = None,
        num_problems: int = 100,
        num_samples: int = 8,
        ks: tuple[int, ...] = (1, 4, 8),
        temperature: float = 1.0,
        max_new_tokens: int | None = None,
        every_n_validations: int = 1,
        on_test: bool = True,
        batch_size: int | None = None,
        seed: int = 0,
    ):
        owner = "TaskEvaluation"
        self.tasks = check_tasks(owner, "tasks", tasks)
        self.num_problems = check_int(f"{owner}.num_problems", num_problems, 1)
        self.num_samples = check_int(f"{owner}.num_samples", num_samples, 1)
        ks = list(ks)
        ok = bool(ks) and all(is_int(k) and 1 <= k <= num_samples for k in ks)
        check(ok, f"{owner}.ks", ks, f"a non-empty list of integers in [1, num_samples={num_samples}]")
        self.ks = tuple(sorted(set(ks)))
        # > 0: coverage needs sampling
        self.temperature = check_number(f"{owner}.temperature", temperature, 0, open_min=True)
        self.max_new_tokens = check_int(f"{owner}.max_new_tokens", max_new_tokens, 1, optional=True)
        self.every_n_validations = check_int(f"{owner}.every_n_validations", every_n_validations, 1)
        self.on_test = bool(on_test)
        self.batch_size = check_int(f"{owner}.batch_size", batch_size, 1, optional=True)
        self.seed = check_int(f"{owner}.seed", seed, 0)
        self.validations = 0
        self.latest: dict[str, float] = {}

    # --- hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        require(pl_module, StudentHolder, "TaskEvaluation")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.validations += 1
        if (self.validations - 1) % self.every_n_validations == 0:
            self._run(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.on_test:
            self._run(trainer, pl_module, "test")

    def summary(self) -> dict[str, float]:
        return dict(self.latest)

    def state_dict(self) -> dict:
        return {"validations": self.validations, "latest": dict(self.latest)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.validations = int(state_dict["validations"])
        self.latest = dict(state_dict.get("latest", {}))

    # --- evaluation -------------------------------------------------------------------------------
    def _problems(self, trainer, split: str) -> list[tuple[str, list[dict]]]:
        datamodule = getattr(trainer, "datamodule", None)
        dm_tasks = [t.name for t in getattr(datamodule, f"{split}_tasks", [])]
        dm_sets = getattr(datamodule, f"{split}_sets", None) or []
        out = []
        for name in self.tasks if self.tasks is not None else dm_tasks:
            if name in dm_tasks and dm_tasks.index(name) < len(dm_sets):
                dataset = dm_sets[dm_tasks.index(name)]
                rows = [dataset[i] for i in range(min(self.num_problems, len(dataset)))]
            else:
                rows = get_task(name).rows(self.num_problems, seed=path_seed("task_evaluation", split))
            if rows:
                out.append((name, rows))
        return out

    def _run(self, trainer, pl_module, split: str) -> None:
        batch_size = self.batch_size or getattr(evaluation_settings(trainer), "batch_size", 256)
        for name, rows in self._problems(trainer, split):
            sampler = RolloutSampler(
                mix=0.0,
                max_new_tokens=self.max_new_tokens or eval_budget(trainer, name),
                temperature=self.temperature,
            )
            with gathered(pl_module.student):  # under FSDP: one gather per task, same on every rank
                values = self.evaluate(trainer, pl_module, get_task(name), rows, sampler, batch_size)
            for key, value in values.items():
                metric = f"{split}/{name}/{key}"
                pl_module.log(metric, value, add_dataloader_idx=False, batch_size=len(rows))
                self.latest[metric] = value

    def evaluate(self, trainer, pl_module, task, rows, sampler, batch_size) -> dict[str, float]:
        """Coverage and sample entropy of one task's problems (`rows`); under data parallelism each
        rank samples its share of the problems (`rank_share`) and the ranks' sums are added up.

        Sampling calls hold whole problems (`batch_size` rounded down to a multiple of
        `num_samples`, at least one problem): a seeded sample is keyed by its prompt's occurrence
        within the call, so a problem split over two calls would draw the same samples twice, and
        the figures would depend on how problems fall into calls (on the number of ranks)."""
        n, mine = self.num_samples, rank_share(rows)
        repeated = [row for row in mine for _ in range(n)]  # a problem's samples are adjacent
        correct: list[bool] = []
        answers: list[str | None] = []
        entropy_sum, entropy_count = 0.0, 0
        per_call = max(1, batch_size // n) * n
        for rollout in student_rollouts(trainer, pl_module, repeated, sampler, per_call, seed=self.seed):
            first = len(correct)
            for text, row in zip(rollout.completions(pl_module.tokenizer), repeated[first:]):
                correct.append(task.score(text, row) > 0)
                answers.append(
                    task.answer(text, row) if getattr(task, "answer_uses_row", False) else task.answer(text)
                )
            # Logits of the completion columns only, in row chunks of at most ~256 MB of float32.
            mask = rollout.completion_mask[:, 1:]
            keep = completion_width(mask)
            step = max(1, LOGIT_BUDGET // (keep * pl_module.vocab_size))
            for r in range(0, rollout.batch_size, step):
                ids, attn = rollout.input_ids[r : r + step], rollout.attention_mask[r : r + step]
                logits = next_token_logits(pl_module.student, ids, attn, pl_module.vocab_size, keep, trainer)
                s, c = masked_sum_count(token_entropy(logits), mask[r : r + step, -keep:])
                entropy_sum, entropy_count = entropy_sum + s, entropy_count + c
        by_problem = [slice(i, i + n) for i in range(0, len(correct), n)]
        keys = [f"pass@{k}" for k in self.ks] + ["distinct_correct"]
        means = (
            coverage_metrics([correct[s] for s in by_problem], [answers[s] for s in by_problem], self.ks)
            if mine
            else dict.fromkeys(keys, 0.0)
        )
        *sums, entropy_sum, entropy_count = summed_over_ranks(
            [means[k] * len(mine) for k in keys] + [entropy_sum, entropy_count], pl_module.device
        )
        values = {k: total / len(rows) for k, total in zip(keys, sums)}
        values["sample_entropy"] = entropy_sum / entropy_count if entropy_count else 0.0
        return values

"""`Forgetting`: how much of the student's prior abilities survives distillation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import lightning as L

from distill.callbacks.contract import StudentHolder, require
from distill.callbacks.generation import log_scalars, rank_share, student_rollouts, summed_over_ranks
from distill.callbacks.interval import StepInterval
from distill.callbacks.options import check_tasks
from distill.checks import check_int
from distill.models.forward import causal_nll, eval_no_grad
from distill.parallel import gathered
from distill.precision import step_precision
from distill.rollout import RolloutSampler
from distill.tasks.qa_datasets import FILE_BUILDERS, parse_spec
from distill.tasks.registry import get_task
from distill.tasks.text_datasets import TextSet, is_text_spec, load_text_set

ROWS_SEED = 7919  # retention rows: fixed, so every run and every step scores the same examples
# Float32 logits per LM-head chunk of the text NLL (~260 positions at 128k vocabularies): full
# [B, T, V] logits of 32 texts would take ~16 MB per padded column.
NLL_LOGIT_BUDGET_MB = 128.0


def load_nll_texts(nll_texts: Mapping[str, Sequence[str] | str] | None) -> dict[str, list[str] | TextSet]:
    """name -> texts, reading a `str` value as a text spec (``text:…``, see
    `distill.tasks.text_datasets`; kept as its `TextSet`) or else a UTF-8 file with one text per
    (non-empty) line."""
    if nll_texts is None:
        return {}
    if not isinstance(nll_texts, Mapping):
        raise ValueError(
            f"Forgetting.nll_texts must be None or a mapping name -> texts, path or text spec, got {nll_texts!r}"
        )
    out = {}
    for name, value in nll_texts.items():
        if is_text_spec(value):
            out[str(name)] = load_text_set(value, f"Forgetting.nll_texts[{name!r}]")
            continue
        if isinstance(value, (str, Path)):
            path = Path(value)
            if not path.is_file():
                raise ValueError(f"Forgetting.nll_texts[{name!r}]: file {str(path)!r} does not exist")
            texts = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        elif isinstance(value, Sequence) and all(isinstance(t, str) for t in value):
            texts = list(value)
        else:
            raise ValueError(
                f"Forgetting.nll_texts[{name!r}] must be a list of strings, a path to a .txt file or a "
                f"text spec 'text:<source>?field=<name>', got {value!r}"
            )
        if not texts:
            raise ValueError(f"Forgetting.nll_texts[{name!r}] holds no texts")
        out[str(name)] = texts
    return out


def source_key(source: str) -> str:
    """A dataset source as compared between specs: a local file by its resolved path."""
    if Path(source).suffix.lower() in FILE_BUILDERS:
        return str(Path(source).expanduser().resolve())
    return source


def trained_rows(trainer) -> dict[tuple[str, str], frozenset[int]]:
    """(source, split) -> the source row indices the run trains on, when its training task is a
    dataset spec (`distill.tasks.qa_datasets`); empty otherwise."""
    task = getattr(getattr(trainer, "datamodule", None), "task", None)
    if not getattr(task, "spec", ""):
        return {}
    parsed = parse_spec(task.spec)
    indices = frozenset(task.items[i].source_index for i in task.parts["train"])
    return {(source_key(parsed.source), parsed.split): indices}


def retention_rows(task, n: int, trained: dict | None = None) -> list[dict]:
    """`n` fixed rows of a retention task: generated tasks by `ROWS_SEED`; a dataset spec's QA task
    from its held-out parts (validation, then test), minus rows the run trains on."""
    if not hasattr(task, "parts"):
        return task.rows(n, seed=ROWS_SEED)
    parsed = parse_spec(task.spec)
    exclude = (trained or {}).get((source_key(parsed.source), parsed.split), frozenset())
    held_out = task.rows(len(task.items), 0, "val") + task.rows(len(task.items), 0, "test")
    rows = [row for row in held_out if row["source_index"] not in exclude][:n]
    if not rows:
        raise ValueError(
            f"Forgetting.sets: {task.name!r} has no held-out rows outside this run's training rows "
            f"(give the spec val=… or test=… sizes > 0)"
        )
    return rows


class Forgetting(L.Callback):
    """Retention sets scored before any update (step 0), every `every_n_steps` optimiser steps and
    at the end of fit.

    Logged per set: `forgetting/<set>/score` and `forgetting/<set>/delta`, and their mean
    `forgetting/mean_delta` (over all sets, whatever their unit). A POSITIVE delta always means
    MORE forgetting: for task sets the score is greedy accuracy and delta = start - now; for text
    sets the score is the student's negative log-likelihood per token (nats) and
    delta = now - start. The step-0 scores are kept in the callback's checkpoint state, so a
    resumed run keeps measuring against the original student.

    Args:
        sets: verifier-scored tasks (registry names or QA dataset specs such as
            ``sciq:allenai/sciq?split=test``; default: the tiny world's prior abilities), scored by
            greedy accuracy of the student alone, prompted as in training (chat template or not)
            and scored as the task scores it (extracted answer). A dataset spec's rows come from its
            held-out parts (validation, then test), never from rows the run trains on.
        num_examples: examples per task set (fixed rows, the same at every evaluation).
        every_n_steps: evaluate every N optimiser steps (plus step 0 and the end).
        nll_texts: optional text sets: a mapping name -> list of texts, name -> path of a UTF-8
            .txt file with one text per line (blank lines skipped), or name -> text spec
            ``text:<source>?field=<column>[&split=…&rows=…&seed=…&config=…]`` (hub id or local
            json/jsonl/parquet/csv; seeded fixed rows; see `distill.tasks.text_datasets`). Rows the
            run trains on (a training dataset spec with the same source and split) are left out.
            Read when the callback is built.
        max_new_tokens: greedy completion budget for task sets (a chat model reasoning before its
            answer needs a few hundred tokens).
        batch_size: sequences per generation or forward pass.
        max_text_tokens: tokens kept from the start of each NLL text (longer ones are truncated).
    """

    def __init__(
        self,
        sets: Sequence[str] = ("addition", "reversal"),
        num_examples: int = 100,
        every_n_steps: int = 50,
        nll_texts: Mapping[str, Sequence[str] | str] | None = None,
        max_new_tokens: int = 32,
        batch_size: int = 128,
        max_text_tokens: int = 512,
    ):
        owner = "Forgetting"
        self.sets = check_tasks(owner, "sets", list(sets)) if list(sets) else []
        self.num_examples = check_int(f"{owner}.num_examples", num_examples, 1)
        self.every_n_steps = check_int(f"{owner}.every_n_steps", every_n_steps, 1)
        self.interval = StepInterval(self.every_n_steps)
        loaded = load_nll_texts(nll_texts)
        self.text_sets = {k: v for k, v in loaded.items() if isinstance(v, TextSet)}
        self.nll_texts = {k: v.select() if isinstance(v, TextSet) else v for k, v in loaded.items()}
        self.max_new_tokens = check_int(f"{owner}.max_new_tokens", max_new_tokens, 1)
        self.batch_size = check_int(f"{owner}.batch_size", batch_size, 1)
        self.max_text_tokens = check_int(f"{owner}.max_text_tokens", max_text_tokens, 2)
        clash = sorted(set(self.sets) & set(self.nll_texts))
        if clash:
            raise ValueError(
                f"Forgetting: names {clash} are in both sets and nll_texts; rename the text sets"
            )
        if not self.sets and not self.nll_texts:
            raise ValueError("Forgetting: sets and nll_texts are both empty; give at least one retention set")
        self.rows = {name: retention_rows(get_task(name), self.num_examples) for name in self.sets}
        self.baseline: dict[str, float] | None = None
        self.latest: dict[str, float] = {}
        self.last_step = -1

    # --- hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        require(pl_module, StudentHolder, "Forgetting")
        trained = trained_rows(trainer)
        if not trained:
            return
        # Keep the dataset sets disjoint from the rows this run trains on (same source and split).
        self.rows = {name: retention_rows(get_task(name), self.num_examples, trained) for name in self.sets}
        for name, text_set in self.text_sets.items():
            exclude = trained.get((source_key(text_set.spec.source), text_set.spec.split), frozenset())
            self.nll_texts[name] = text_set.select(exclude=exclude)
            if not self.nll_texts[name]:
                raise ValueError(f"Forgetting.nll_texts[{name!r}]: every row is a training row of this run")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.last_step < 0:  # the starting point; a resumed run measured it before its checkpoint
            self._measure(trainer, pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.interval.batch_start(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.interval.due_after(trainer):
            self._measure(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._measure(trainer, pl_module)

    def summary(self) -> dict[str, float]:
        return dict(self.latest)

    def state_dict(self) -> dict:
        return {"baseline": self.baseline, "latest": self.latest, "last_step": self.last_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.baseline = state_dict["baseline"]
        self.latest = dict(state_dict["latest"])
        self.last_step = int(state_dict["last_step"])

    # --- measurement ------------------------------------------------------------------------------
    def _measure(self, trainer, pl_module) -> None:
        if trainer.global_step == self.last_step:
            return  # already measured these weights (e.g. the last interval is the last step)
        self.last_step = trainer.global_step
        # Under FSDP one gather for the whole measurement; under the step's precision (the text NLL too).
        with gathered(pl_module.student), step_precision(trainer):
            scores = self.scores(trainer, pl_module)
        if self.baseline is None:
            self.baseline = scores
        metrics = {}
        for name, score in scores.items():
            start = self.baseline[name]
            metrics[f"forgetting/{name}/score"] = score
            metrics[f"forgetting/{name}/delta"] = score - start if name in self.nll_texts else start - score
        deltas = [v for k, v in metrics.items() if k.endswith("/delta")]
        metrics["forgetting/mean_delta"] = sum(deltas) / len(deltas)
        self.latest = metrics
        log_scalars(trainer, metrics)

    def scores(self, trainer, pl_module) -> dict[str, float]:
        """Current score of every set: greedy accuracy (task sets), NLL per token (text sets).
        Under data parallelism each rank rolls out its share of a task set's rows and scores its
        share of a text set's texts (`rank_share`); the sums are added over the ranks."""
        out = {}
        sampler = RolloutSampler(mix=0.0, max_new_tokens=self.max_new_tokens, temperature=0.0)
        for name, rows in self.rows.items():
            task, mine = get_task(name), rank_share(rows)
            texts = [
                text
                for rollout in student_rollouts(trainer, pl_module, mine, sampler, self.batch_size)
                for text in rollout.completions(pl_module.tokenizer)
            ]
            correct = sum(task.score(t, r) for t, r in zip(texts, mine))
            out[name] = summed_over_ranks([correct], pl_module.device)[0] / len(rows)
        for name, texts in self.nll_texts.items():
            total, count = summed_over_ranks(self.nll_sums(pl_module, rank_share(texts)), pl_module.device)
            out[name] = self._mean(total, count)
        return out

    def nll_per_token(self, pl_module, texts: list[str]) -> float:
        """Mean negative log-likelihood (nats) of the texts' tokens under the student, each token
        predicted from the tokens before it (the first token of each text is context only)."""
        return self._mean(*self.nll_sums(pl_module, texts))

    @staticmethod
    def _mean(total: float, count: float) -> float:
        if count == 0:
            raise ValueError(
                "Forgetting: the NLL texts tokenise to no predictable tokens (each needs >= 2 tokens)"
            )
        return total / count

    def nll_sums(self, pl_module, texts: list[str]) -> tuple[float, int]:
        """(summed NLL in nats, predicted tokens) of `texts` under the student (`nll_per_token`)."""
        tokenizer, student, total, count = pl_module.tokenizer, pl_module.student, 0.0, 0
        for start in range(0, len(texts), self.batch_size):
            enc = tokenizer(
                texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_text_tokens,
            )
            ids, attn = enc["input_ids"].to(pl_module.device), enc["attention_mask"].to(pl_module.device)
            # A target counts when it and its context token are real (either padding side).
            mask = attn[:, 1:].bool() & attn[:, :-1].bool()
            with eval_no_grad(student):
                nll = causal_nll(student, ids, attn, pl_module.vocab_size, mask, NLL_LOGIT_BUDGET_MB)
            total += float(nll.sum())
            count += nll.numel()
        return total, count

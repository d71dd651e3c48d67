"""Data parallelism: 2 `gloo` processes, with DDP or with FSDP2 (`distill.parallel`), update the
student exactly as 1 process does on the same global batch and log the same `train/*` figures; the
ranks shard the prompts (evaluation batches equal in number on every rank); only rank 0 writes run
files. A whole `distill fit` under FSDP2 reports what one process reports."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distill.data.module import ResumableShuffle

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _step(kind: str, devices: int, world: Path, out: Path, parallel: str = "ddp") -> tuple[dict, list[dict]]:
    """Run tests/ddp_step.py; the student's update and each rank's logged figures."""
    out.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(HERE / "ddp_step.py"), str(out), str(world), str(devices), kind, parallel]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)]
    return torch.load(out / "update.pt"), logged


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["distill", "grpo"])
def test_two_ranks_update_and_log_like_one_process(kind, quick_world, tmp_path):
    """Same global batch (8 rows, completions of 1-14 tokens), SGD at lr 1 without clipping, on
    2 DDP ranks and on 2 FSDP2 ranks (the student sharded, gathered back for the comparison): the
    update is -gradient, so the old bug (each rank's local sum over the global token count, then
    DDP's average: 1/2 of the gradient) would miss by half. Tolerance: float32 sums taken in
    another order (ranks, micro-batches) differ by a few ulps of the summed terms, ~1e-8 here
    against updates of ~0.2; 1e-6 absolute leaves room and is 1e5 x below the bug's error."""
    single, (logged_single,) = _step(kind, 1, quick_world, tmp_path / "one")
    assert max(float(u.abs().max()) for u in single.values()) > 1e-2  # a real update
    assert set(logged_single) >= {"train/loss", "train/completion_length", "train/grad_norm"}
    for parallel in ("ddp", "fsdp"):
        update, logged = _step(kind, 2, quick_world, tmp_path / parallel, parallel)
        assert update.keys() == single.keys()
        for name, expected in single.items():
            torch.testing.assert_close(
                update[name], expected, rtol=1e-4, atol=1e-6, msg=f"{parallel}: {name}"
            )
        # Every rank logs the global per-token means, equal to the single process's.
        for rank_logged in logged:
            assert rank_logged.keys() == logged_single.keys()
            for key, value in logged_single.items():
                assert rank_logged[key] == pytest.approx(value, rel=1e-5, abs=1e-7), f"{parallel}: {key}"
    if kind == "grpo":  # the second, off-policy pass clips some tokens: a summed figure, not 0
        assert logged_single["train/clip_fraction"] > 0


@pytest.mark.parametrize("world", [2, 3])
def test_training_shards_together_are_the_single_process_batches(world):
    """The ranks' k-th batches of B are, together, the single-process k-th batch of B x world; the
    shards are disjoint, equal in length, and a mid-epoch resume skips each rank's consumed items."""
    n, seed, b = 50, 3, 4
    one = list(ResumableShuffle(n, seed))
    shards = [list(ResumableShuffle(n, seed, world, r)) for r in range(world)]
    assert {len(s) for s in shards} == {n // world}
    assert len(set().union(*map(set, shards))) == world * (n // world)
    for k in range(n // (world * b)):
        together = sorted(i for s in shards for i in s[k * b : (k + 1) * b])
        assert together == sorted(one[k * world * b : (k + 1) * world * b])
    for r in range(world):
        resumed = ResumableShuffle(n, seed, world, r)
        resumed.set_epoch(2)
        resumed.resume(2, consumed=2 * b)
        fresh = ResumableShuffle(n, seed, world, r)
        fresh.set_epoch(2)
        assert list(resumed) == list(fresh)[2 * b :]
        assert list(fresh) != shards[r]  # another epoch, another order


class _FakeTrainer:
    def __init__(self, world_size: int, global_rank: int):
        self.world_size, self.global_rank = world_size, global_rank


def _datamodule(world_size: int, rank: int, char_tok, **kwargs):
    from distill.data import RolloutDataModule

    dm = RolloutDataModule(task="countdown3", val_size=kwargs.pop("val_size", 7), eval_batch_size=2, **kwargs)
    dm.tokenizer = char_tok
    dm.trainer = _FakeTrainer(world_size, rank)
    return dm


def test_evaluation_prompts_are_split_without_repeats(char_tok):
    """7 validation prompts on 2 ranks: 4 + 3, each prompt scored once (a padding sampler would
    score one twice and bias the summed accuracy)."""
    seen = []
    for rank in range(2):
        dm = _datamodule(2, rank, char_tok)
        dm.setup("validate")
        (loader,) = dm.val_dataloader()
        seen.append([row["prompt"] for batch in loader for row in batch["rows"]])
    assert sorted(map(len, seen)) == [3, 4]
    assert sorted(seen[0] + seen[1]) == sorted(row["prompt"] for row in dm.val_sets[0])


@pytest.mark.parametrize(
    "n, world", [(n, w) for w in (2, 3) for n in (0, 2, 3, 5, 7, 8, 13, 64) if n >= w or n == 0]
)
@pytest.mark.parametrize("batch_size", [1, 2, 3, 250])
def test_evaluation_batches_are_as_many_on_every_rank(n, batch_size, world):
    """Ranks walk their evaluation loops in step (under FSDP each batch's rollout is a collective):
    equally many non-empty batches on every rank, together every prompt once, each batch within
    `batch_size` (one over only for batch size 1 with unequal shards)."""
    from distill.data.module import EvenBatches

    ranks = [list(EvenBatches(n, batch_size, world, r)) for r in range(world)]
    assert len({len(batches) for batches in ranks}) == 1
    if n == 0:  # data.val_size / test_size 0: no evaluation
        assert ranks == [[]] * world
        return
    every = [i for batches in ranks for batch in batches for i in batch]
    assert sorted(every) == list(range(n))
    limit = batch_size + (batch_size == 1 and n % world != 0)
    assert all(1 <= len(batch) <= limit for batches in ranks for batch in batches)
    assert len(ranks[0]) == min(math.ceil(math.ceil(n / world) / batch_size), n // world)  # no more


def test_a_rank_resumes_its_own_reused_rollouts_and_refuses_another_world(char_tok, monkeypatch):
    """Each rank's reused rollout batch (data.refresh_every > 1) is its own after a resume; a
    checkpoint written by 2 ranks with batches to reuse cannot resume on 1 or 3."""
    import distill.data.module as data_module

    monkeypatch.setattr(data_module, "RolloutBatch", lambda **fields: fields)
    mine = [{"step": 3, "rollout": {"input_ids": f"rank {r}"}, "rows": [r]} for r in range(2)]
    state = {"position": {"epoch": 0, "batches": 4}, "reuse": None, "reuse_by_rank": mine}
    for rank in range(2):
        dm = _datamodule(2, rank, char_tok, refresh_every=3)
        dm.load_state_dict(state)
        step, out = dm._reuse
        assert step == 3 and out["rows"] == [rank] and out["rollout"] == {"input_ids": f"rank {rank}"}
    for world in (1, 3):
        with pytest.raises(ValueError, match=rf"batches of 2 rank\(s\).*on 2 device\(s\), not {world}"):
            _datamodule(world, 0, char_tok, refresh_every=3).load_state_dict(state)
    # One process's checkpoint (or one of several ranks from before per-rank saving) on 2 ranks.
    single = {"position": state["position"], "reuse": mine[0]}
    with pytest.raises(ValueError, match=r"batches of 1 rank\(s\).*on 1 device\(s\), not 2"):
        _datamodule(2, 1, char_tok, refresh_every=3).load_state_dict(single)
    # Nothing to reuse: any layout resumes.
    dm = _datamodule(3, 2, char_tok, refresh_every=3)
    dm.load_state_dict({**state, "reuse_by_rank": [None, None]})
    assert dm._reuse is None and dm._position == state["position"]


def test_evaluation_needs_a_prompt_per_rank(char_tok):
    dm = _datamodule(4, 0, char_tok, val_size=3)
    with pytest.raises(
        ValueError, match=r"data\.val_size must be 0 or at least the number of ranks \(4\), got 3"
    ):
        dm.setup("validate")


def test_a_rank_other_than_zero_writes_no_run_file(tiny_world_cache, tmp_path, monkeypatch):
    """A fit on rank 1 (as DDP's other processes see `rank_zero_only.rank`) runs to its end but
    writes and removes nothing in the run directory: an earlier attempt's file stays as it was, no
    config, env, metrics or exported student appear (rank 0 writes those; tests/test_cli.py)."""
    from lightning.fabric.utilities import rank_zero as fabric_rank_zero
    from lightning.pytorch.utilities import rank_zero as pytorch_rank_zero

    from distill.lightning_cli import run_lightning_cli

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("an earlier attempt's\n")
    for module in (fabric_rank_zero, pytorch_rank_zero):
        monkeypatch.setattr(module.rank_zero_only, "rank", 1)
    short = {"max_steps": "1", "val_check_interval": "1", "log_every_n_steps": "1"}
    data = {"batch_size": "2", "train_size": "8", "val_size": "2", "test_size": "2", "max_new_tokens": "4"}
    args = [f"--trainer.{k}={v}" for k, v in short.items()] + [f"--data.{k}={v}" for k, v in data.items()]
    metrics = run_lightning_cli(
        ["fit", "--config", "configs/tiny/fkl_mix0.yaml", *args, "--data.eval_max_new_tokens=4"]
        + ["--trainer.enable_checkpointing=false", "--trainer.callbacks=[]", "--run_dir", str(run)]
    )
    assert "train/loss" in metrics and "test/countdown3/accuracy" in metrics  # it did run
    assert [p.name for p in run.iterdir()] == ["config.yaml"]
    assert (run / "config.yaml").read_text() == "an earlier attempt's\n"


class _Mesh:
    """What `shard_model` reads of a device mesh before sharding: its dimensions' names and sizes."""

    mesh_dim_names = ("data_parallel", "tensor_parallel")

    def __init__(self, tp: int):
        self.tp = tp

    def __getitem__(self, name):
        size = self.tp if name == "tensor_parallel" else 2
        return type("Dim", (), {"size": lambda _self: size})()


def test_shard_model_refuses_tensor_parallelism_and_models_without_blocks():
    from distill.parallel import shard_model

    with pytest.raises(
        ValueError, match=r"model\.student: trainer\.strategy\.tensor_parallel_size must be 1 .*got 2"
    ):
        shard_model(torch.nn.Linear(2, 2), _Mesh(tp=2), "model.student")
    with pytest.raises(
        ValueError, match=r"model\.student: cannot find the transformer blocks of Linear .*\[\]"
    ):
        shard_model(torch.nn.Linear(2, 2), _Mesh(tp=1), "model.student")
    plain = torch.nn.Linear(2, 2)
    assert shard_model(plain, None, "model.student") is plain  # outside ModelParallelStrategy

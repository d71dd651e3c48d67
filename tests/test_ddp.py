"""Data parallelism: 2 `gloo` processes, with DDP or with FSDP2 (`distill.parallel`), update the
student exactly as 1 process does on the same global batch and log the same `train/*` figures; the
ranks shard the prompts (evaluation batches equal in number on every rank); only rank 0 writes run
files. A whole `distill fit` under FSDP2 reports what one process reports. Under DDP the frozen
model stays out of the start-up broadcast, gradients are all-reduced once per optimiser step, one
rank's failure ends every rank, and the measurement callbacks split their rows over the ranks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distill.data.order import ResumableShuffle

pytestmark = pytest.mark.cores(2)  # Two ranks at a time.

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


KINDS = ("distill", "grpo")


def _steps(devices: int, world: Path, out: Path, parallel: str = "ddp") -> dict[str, tuple[dict, list[dict]]]:
    """Run tests/ddp_step.py for both kinds in one launch; per kind, the student's update and each
    rank's logged figures."""
    out.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        str(HERE / "ddp_step.py"),
        str(out),
        str(world),
        str(devices),
        ",".join(KINDS),
        parallel,
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {
        kind: (
            torch.load(out / kind / "update.pt"),
            [json.loads((out / kind / f"rank{r}.json").read_text()) for r in range(devices)],
        )
        for kind in KINDS
    }


@pytest.mark.slow
def test_two_ranks_update_and_log_like_one_process(quick_world, tmp_path):
    """Same global batch (8 rows, completions of 1-14 tokens), SGD at lr 1 without clipping, on
    2 DDP ranks and on 2 FSDP2 ranks (the student sharded, gathered back for the comparison), for a
    distillation module and a GRPO one: the update is -gradient, so the old bug (each rank's local
    sum over the global token count, then DDP's average: 1/2 of the gradient) would miss by half.
    Tolerance: float32 sums taken in another order (ranks, micro-batches) differ by a few ulps of
    the summed terms, ~1e-8 here against updates of ~0.2; 1e-6 absolute leaves room and is 1e5 x
    below the bug's error. Each launch runs both kinds (its second fit reuses the ranks)."""
    singles = _steps(1, quick_world, tmp_path / "one")
    runs = {parallel: _steps(2, quick_world, tmp_path / parallel, parallel) for parallel in ("ddp", "fsdp")}
    for kind in KINDS:
        single, (logged_single,) = singles[kind]
        assert max(float(u.abs().max()) for u in single.values()) > 1e-2, kind  # a real update
        assert set(logged_single) >= {"train/loss", "train/completion_length", "train/grad_norm"}
        for parallel, by_kind in runs.items():
            update, logged = by_kind[kind]
            assert update.keys() == single.keys()
            if parallel == "ddp":
                # 2 micro-batches per rank: DDP all-reduces the accumulated gradients in the last
                # backward only (`distill.parallel.gradient_sync`), once per optimiser step (GRPO
                # takes 2 on its batch), not once per micro-batch.
                syncs = [
                    json.loads((tmp_path / "ddp" / kind / f"syncs{r}.json").read_text()) for r in range(2)
                ]
                assert syncs == [1 if kind == "distill" else 2] * 2, kind
            for name, expected in single.items():
                torch.testing.assert_close(
                    update[name], expected, rtol=1e-4, atol=1e-6, msg=f"{kind}, {parallel}: {name}"
                )
            # Every rank logs the global per-token means, equal to the single process's.
            for rank_logged in logged:
                assert rank_logged.keys() == logged_single.keys()
                for key, value in logged_single.items():
                    assert rank_logged[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (
                        f"{kind}, {parallel}: {key}"
                    )
    # GRPO's second, off-policy pass clips some tokens: a summed figure, not 0
    assert singles["grpo"][1][0]["train/clip_fraction"] > 0


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

    dm = RolloutDataModule(
        task="countdown3", evaluation={"val_size": kwargs.pop("val_size", 7), "batch_size": 2}, **kwargs
    )
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
    from distill.data.order import EvenBatches

    ranks = [list(EvenBatches(n, batch_size, world, r)) for r in range(world)]
    assert len({len(batches) for batches in ranks}) == 1
    if n == 0:  # data.evaluation.val_size / test_size 0: no evaluation
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
        ValueError, match=r"data\.evaluation\.val_size must be 0 or at least the number of ranks \(4\), got 3"
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
    data = {
        "batch_size": "2",
        "train_size": "8",
        "evaluation.val_size": "2",
        "evaluation.test_size": "2",
        "sampling.max_new_tokens": "4",
    }
    args = [f"--trainer.{k}={v}" for k, v in short.items()] + [f"--data.{k}={v}" for k, v in data.items()]
    metrics = run_lightning_cli(
        ["fit", "--config", "configs/tiny/fkl_mix0.yaml", *args, "--data.evaluation.max_new_tokens=4"]
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


# --- what a first multi-GPU run would hit ------------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["distill", "grpo"])
def test_ddp_leaves_the_frozen_model_out_of_its_start_up_broadcast(kind, quick_world, tmp_path, monkeypatch):
    """DDP wraps the LightningModule itself (Lightning's `DDPStrategy.configure_ddp`) and broadcasts
    every parameter and buffer it is not told to ignore from rank 0 (`torch.distributed.utils.
    _sync_module_states`): the student's, never the frozen teacher's (16 GB at paper scale) or
    GRPO's reference's. One gloo rank suffices: the broadcast is called all the same."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from distill.module import DistillationModule
    from distill.rl import GRPOModule

    if kind == "distill":
        module = DistillationModule(
            student=str(quick_world / "student"), teacher=str(quick_world / "teacher")
        )
    else:
        module = GRPOModule(student=str(quick_world / "student"), log_kl_to_start=True)
    module.configure_model()
    frozen = module.teacher if kind == "distill" else module.reference
    sent: list[torch.Tensor] = []
    broadcast = dist._broadcast_coalesced

    def record(group, tensors, *args):
        sent.extend(tensors)
        return broadcast(group, tensors, *args)

    monkeypatch.setattr(dist, "_broadcast_coalesced", record)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        DistributedDataParallel(module)
    finally:
        dist.destroy_process_group()
    sent_ids = {t.data_ptr() for t in sent}
    assert {t.data_ptr() for t in [*frozen.parameters(), *frozen.buffers()]}.isdisjoint(sent_ids)
    assert {t.data_ptr() for t in module.student.parameters()} <= sent_ids  # the student still is


@pytest.mark.slow
@pytest.mark.parametrize("fail_rank", [0, 1])
def test_one_rank_failing_ends_every_rank_within_a_minute(fail_rank, tmp_path):
    """Rank `fail_rank` raises while the other rank is busy for 10 minutes (tests/ddp_failure.py):
    every process (the launched rank included, which would outlive its parent) is gone within
    60 s of the failure, the failing rank's error on stderr. Rank 1 failing is Lightning's own
    doing (its launcher's process observer); rank 0 failing is `end_launched_ranks_on_failure`'s."""
    import signal
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(HERE / "ddp_failure.py"), str(tmp_path), str(fail_rank)]
    # Its own session, so that the launched rank can be killed with it if the test fails; the
    # pipes stay open until every process holding them (the launched rank too) has exited.
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the ranks were still running 240 s after the start")
    ended = time.time()
    failed_at = float((tmp_path / "failed_at").read_text())
    assert ended - failed_at < 60
    assert proc.returncode != 0
    assert f"RuntimeError: boom on rank {fail_rank}" in stderr
    if fail_rank == 0:
        assert (
            "distill: rank 0 failed (RuntimeError: boom on rank 0); ending the 1 rank(s) rank 0 launched"
            in stderr
        )


def test_distill_fit_ends_the_ranks_it_launched_when_it_fails(tmp_path):
    """`DistillCLI.execute` on rank 0: a failure anywhere in the run (fit, the final checkpoint,
    export, test) kills the ranks its launcher started, then propagates."""
    from types import SimpleNamespace

    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

    from distill.lightning_cli import DistillCLI

    launcher = _SubprocessScriptLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    launcher.procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])]
    cli = DistillCLI.__new__(DistillCLI)
    cli.config = SimpleNamespace(run_dir=str(tmp_path))
    cli.trainer = SimpleNamespace(
        strategy=SimpleNamespace(launcher=launcher), global_rank=0, global_step=7, interrupted=False
    )
    cli.stop, cli.resume_step = None, None

    def fail(command, run_dir):
        raise MemoryError("out of memory in export")

    cli._execute = fail
    try:
        with pytest.raises(MemoryError, match="out of memory in export"):
            cli.execute("fit")
        assert launcher.procs[0].wait(timeout=10) == -9  # SIGKILL
        record = json.loads((tmp_path / "status.json").read_text())
        assert (record["state"], record["step"], record["reason"]) == (
            "failed",
            7,
            "MemoryError: out of memory in export",
        )
    finally:
        launcher.procs[0].kill()  # a no-op once it has ended


@pytest.mark.slow
def test_measurement_callbacks_split_their_rows_over_the_ranks(tmp_path):
    """`Forgetting`'s task sets, `StyleProbe` and `TaskEvaluation` on 2 gloo ranks
    (tests/ddp_measure.py): each rank rolls out its share of the rows (5 rows: 3 + 2; 3 problems of
    4 samples: 2 + 1) and scores its share of the NLL texts (3 + 2), and every rank gets the figures
    one process computes on all of them."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    port = str(_free_port())

    def run(out: Path, world: int) -> list[dict]:
        out.mkdir()
        cmds = [
            [sys.executable, str(HERE / "ddp_measure.py"), str(out), str(r), str(world), port]
            for r in range(world)
        ]
        procs = [subprocess.Popen(c, env=env, stderr=subprocess.PIPE, text=True) for c in cmds]
        errors = [p.communicate(timeout=300)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * world, errors[0][-3000:] + errors[-1][-3000:]
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]

    (single,) = run(tmp_path / "one", 1)
    ranks = run(tmp_path / "two", 2)
    assert single["rows"] == {"forgetting": 10, "nll_texts": 5, "style": 5, "coverage": 12}
    assert [r["rows"] for r in ranks] == [
        {"forgetting": 6, "nll_texts": 3, "style": 3, "coverage": 8},
        {"forgetting": 4, "nll_texts": 2, "style": 2, "coverage": 4},
    ]
    assert 0 < single["figures"]["forgetting/addition"] < 1 and 0 < single["figures"]["style/share"] < 1
    nll = single["figures"].pop("forgetting/texts")
    assert nll > 0
    for rank in ranks:
        # the text NLL's sums are added in another order over 2 ranks: equal to float rounding
        assert rank["figures"].pop("forgetting/texts") == pytest.approx(nll, rel=1e-12)
        assert rank["figures"] == single["figures"]

"""A tiny-world build killed mid-model resumes from its checkpoint with the weights of an
uninterrupted build."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest
import torch

from distill.models import tiny_world as tw
from distill.models import tiny_world_folders as folders
from distill.models.tiny_world_train import MixtureStream

pytestmark = pytest.mark.cores(2)  # Builds of two threads (the recipe's).


@pytest.mark.parametrize("start", [1, 37, 256, 300])
def test_a_stream_started_late_is_the_whole_streams_tail(start):
    recipe = tw.QUICK.model("teacher")
    whole = list(itertools.islice(iter(MixtureStream(recipe, 0)), start + 20))
    assert list(itertools.islice(iter(MixtureStream(recipe, 0, start=start)), 20)) == whole[start:]


# Run in a child process: train the quick world's teacher alone (`only`: the other models would
# only repeat the same mechanism), checkpointing every 10 steps, and SIGKILL the process at its
# step 17 (once: a marker file says it happened).
KILLED_BUILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from distill.models import tiny_world as tw
    from distill.models.tiny_world_train import BuildProgress

    out, marker = Path(sys.argv[1]), Path(sys.argv[2])
    step_end = BuildProgress.on_train_batch_end

    def kill_once(self, trainer, *args):
        step_end(self, trainer, *args)
        if self.name == "teacher" and trainer.global_step == 17 and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)

    BuildProgress.on_train_batch_end = kill_once
    tw.build(out, tw.QUICK, every=10, only=["teacher"])
    """
)


@pytest.mark.slow
def test_a_killed_build_resumes_mid_model_with_the_same_weights(quick_world, tmp_path):
    from safetensors.torch import load_file

    script, out, marker = tmp_path / "build.py", tmp_path / "world", tmp_path / "killed"
    script.write_text(KILLED_BUILD)
    first = subprocess.run(
        [sys.executable, str(script), str(out), str(marker)], capture_output=True, text=True
    )
    assert first.returncode == -9 and marker.exists(), first.stderr[-2000:]
    assert (out / folders.CHECKPOINTS / "teacher" / "last.ckpt").is_file() and not (out / "teacher").exists()
    second = subprocess.run(
        [sys.executable, str(script), str(out), str(marker)], capture_output=True, text=True
    )
    assert second.returncode == 0, second.stderr[-2000:]
    assert (
        "training teacher (from scratch): 2x64, 30 steps, batch 32, resuming at step 10"
        in (out / "build.log").read_text()
    )
    assert not (out / folders.CHECKPOINTS / "teacher").exists()  # dropped once the model is saved
    # the quick_world fixture: the same recipe, never interrupted
    ours, theirs = (
        load_file(out / "teacher" / "model.safetensors"),
        load_file(quick_world / "teacher" / "model.safetensors"),
    )
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

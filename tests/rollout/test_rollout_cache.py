"""Teacher-rollout cache: reuse across samplers, misses on changed settings or sampler, atomic writes."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import torch

import distill.rollout.cache as cache_module
import distill.rollout.sampler as sampler_module
from distill.rollout import RolloutCache, RolloutSampler, teacher_identity
from distill.rollout.cache import row_key
from distill.rollout.streams import SAMPLER_VERSION

SETTINGS = dict(max_new_tokens=8, vocab_size=100)  # the char tokenizer's vocabulary


def forbid(monkeypatch, model):
    def boom(*args, **kwargs):
        raise AssertionError("the teacher must not run on a cache hit")

    monkeypatch.setattr(model, "forward", boom)


def count_calls(model) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def entries(directory) -> list:
    return sorted(p for p in directory.rglob("*.json"))


def test_second_sampler_reads_cache(tmp_path, student, teacher, prompts, monkeypatch):
    first = RolloutSampler(1.0, "sequence", cache_dir=str(tmp_path), **SETTINGS)
    a = first.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
    assert len(entries(tmp_path)) == 3 and a.cached_teacher_rows == 0 and a.teacher_forward_tokens > 0
    forbid(monkeypatch, teacher)
    second = RolloutSampler(1.0, "batch", cache_dir=str(tmp_path), **SETTINGS)
    b = second.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.teacher_token_mask, b.teacher_token_mask)
    assert b.cached_teacher_rows == 3 and b.teacher_forward_tokens == 0
    assert b.teacher_generated_tokens == a.teacher_generated_tokens


def test_sequence_mode_reuses_rows_under_other_permutations(
    tmp_path, student, teacher, char_tok, monkeypatch
):
    enc = char_tok([f"{i}-{i}=" for i in range(6)], return_tensors="pt", padding=True)
    full = RolloutSampler(1.0, "sequence", cache_dir=str(tmp_path), **SETTINGS)
    reference = full.sample(student, teacher, enc.input_ids, enc.attention_mask, seed=1).completion_ids()
    forbid(monkeypatch, teacher)
    half = RolloutSampler(0.5, "sequence", cache_dir=str(tmp_path), **SETTINGS)
    for g in range(3):
        batch = half.sample(
            student,
            teacher,
            enc.input_ids,
            enc.attention_mask,
            seed=1,
            generator=torch.Generator().manual_seed(g),
        )
        rows = batch.teacher_token_mask.any(1).nonzero().flatten().tolist()
        assert len(rows) == 3 and batch.cached_teacher_rows == 3
        assert [batch.completion_ids()[i] for i in rows] == [reference[i] for i in rows]


@pytest.mark.parametrize("change", [{"seed": 4}, {"temperature": 0.7}, {"top_k": 5}, {"max_new_tokens": 6}])
def test_changed_seed_or_setting_misses(change, tmp_path, student, teacher, prompts):
    RolloutSampler(1.0, "sequence", cache_dir=str(tmp_path), **SETTINGS).sample(
        student, teacher, prompts.input_ids, prompts.attention_mask, seed=3
    )
    seed = change.pop("seed", 3)
    calls = count_calls(teacher)
    batch = RolloutSampler(1.0, "sequence", cache_dir=str(tmp_path), **{**SETTINGS, **change}).sample(
        student, teacher, prompts.input_ids, prompts.attention_mask, seed=seed
    )
    assert calls[0] > 0 and batch.cached_teacher_rows == 0
    assert len(entries(tmp_path)) == 6


def test_changed_teacher_weights_miss(tmp_path, student, teacher, prompts):
    sampler = RolloutSampler(1.0, "sequence", cache_dir=str(tmp_path), **SETTINGS)
    sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
    assert teacher_identity(copy.deepcopy(teacher)) == teacher_identity(teacher)
    with torch.no_grad():
        teacher.lm_head.weight[0, 0] += 1.0  # the first/last parameters are fingerprinted
    batch = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
    assert batch.cached_teacher_rows == 0


def test_unseeded_sampling_is_not_cached_but_greedy_is(tmp_path, student, teacher, prompts, monkeypatch):
    sampler = RolloutSampler(1.0, "sequence", cache_dir=str(tmp_path), **SETTINGS)
    sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask)
    assert entries(tmp_path) == []
    greedy = RolloutSampler(1.0, "sequence", temperature=0, cache_dir=str(tmp_path), **SETTINGS)
    a = greedy.sample(student, teacher, prompts.input_ids, prompts.attention_mask)
    forbid(monkeypatch, teacher)
    b = greedy.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=99)  # seed is moot
    assert torch.equal(a.input_ids, b.input_ids) and b.cached_teacher_rows == 3


def test_token_modes_do_not_touch_cache(tmp_path, student, teacher, prompts):
    for granularity in ("token", "speculative"):
        RolloutSampler(1.0, granularity, cache_dir=str(tmp_path), **SETTINGS).sample(
            student, teacher, prompts.input_ids, prompts.attention_mask, seed=0
        )
    assert entries(tmp_path) == []


def test_interrupted_and_corrupt_entries_are_misses(tmp_path, student, teacher, prompts):
    sampler = RolloutSampler(1.0, "sequence", cache_dir=str(tmp_path), **SETTINGS)
    good = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
    paths = entries(tmp_path)
    # Row 0: an interrupted write (temp file only, final entry gone). Row 1: a truncated entry.
    # Row 2: an entry of the wrong key (e.g. a half-copied cache directory).
    paths[0].rename(paths[0].with_name(f".{paths[0].stem}.abc.tmp"))
    paths[1].write_text(paths[1].read_text()[:-7])
    paths[2].write_text(json.dumps({"key": "other", "tokens": [5, 6]}))
    cache = RolloutCache(tmp_path)
    assert [cache.get(p.stem) for p in paths] == [None, None, None]
    calls = count_calls(teacher)
    again = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
    assert calls[0] > 0 and again.cached_teacher_rows == 0
    assert torch.equal(again.input_ids, good.input_ids)
    assert all(cache.get(p.stem) is not None for p in paths)  # rewritten whole
    assert sorted(cache.get(p.stem) for p in paths) == sorted(again.completion_ids())


def test_put_is_atomic_under_failure(tmp_path, monkeypatch):
    cache = RolloutCache(tmp_path)
    cache.put("ab" + "0" * 62, [1, 2, 3])

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", fail)
    with pytest.raises(OSError, match="disk full"):
        cache.put("ab" + "0" * 62, [9, 9])
    assert cache.get("ab" + "0" * 62) == [1, 2, 3]  # the old entry survives, no temp file is left
    assert [p.name for p in (tmp_path / "ab").iterdir()] == ["ab" + "0" * 62 + ".json"]


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DISTILL_ROLLOUT_CACHE", str(tmp_path))
    assert RolloutSampler(0.5).cache.directory == tmp_path
    monkeypatch.delenv("DISTILL_ROLLOUT_CACHE")
    assert RolloutSampler(0.5).cache is None


def version_1_key(identity, prompt_ids, occurrence, settings, seed) -> str:
    """`row_key` as the per-row-generator sampler (sampler version 1) built it: no version field."""
    blob = {"teacher": identity, "prompt": prompt_ids, "occurrence": occurrence, "settings": settings}
    blob = json.dumps({**blob, "seed": seed}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def test_entries_of_the_old_sampler_are_not_served(tmp_path, student, teacher, prompts, monkeypatch):
    """Seeded tokens changed with the sampling scheme, so a cache filled by the old sampler (keys
    without a sampler version) must miss: plant such entries with marker tokens and sample."""
    seen = []
    monkeypatch.setattr(sampler_module, "row_key", lambda *a: seen.append(a) or row_key(*a))
    sampler = RolloutSampler(1.0, "sequence", cache_dir=str(tmp_path / "new"), **SETTINGS)
    fresh = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
    assert len(seen) == 3
    old = RolloutCache(tmp_path / "old")
    for args in seen:
        assert version_1_key(*args) != row_key(*args)
        old.put(version_1_key(*args), [7, 7, 7])
    sampler.cache = old
    calls = count_calls(teacher)
    batch = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
    assert calls[0] > 0 and batch.cached_teacher_rows == 0
    assert torch.equal(batch.input_ids, fresh.input_ids)
    # The same planted entries are served when the key scheme is the old one (the test has teeth).
    monkeypatch.setattr(sampler_module, "row_key", version_1_key)
    stale = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
    assert stale.cached_teacher_rows == 3 and stale.completion_ids() == [[7, 7, 7]] * 3


def test_sampler_version_enters_the_key(monkeypatch):
    args = ("t@0", [1, 2], 0, {"temperature": 1.0}, 3)
    current = row_key(*args)
    monkeypatch.setattr(cache_module, "SAMPLER_VERSION", SAMPLER_VERSION + 1)
    assert row_key(*args) != current


def test_teacher_identity_reads_large_parameters_to_their_last_element_and_keeps_small_keys():
    """A parameter past 2**24 elements (SmolLM2's 49,152 x 576 embedding; every paper model's)
    once made float32 indices round past its end. Small parameters keep the picks every cache key
    written so far was made with (float32 linspace, checked here against that formula)."""
    import hashlib

    from torch import nn

    big = nn.Module()
    big.weight = nn.Parameter(torch.zeros(49_152 * 576, dtype=torch.bfloat16), requires_grad=False)
    before = teacher_identity(big)
    with torch.no_grad():
        big.weight[-1] = 1.0  # the last element is one of the picks
    assert teacher_identity(big) != before

    small = nn.Linear(7, 5)
    digest = hashlib.sha256()
    params = list(small.named_parameters())
    for name, p in params:
        digest.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
    for index in sorted({0, len(params) // 2, len(params) - 1}):
        flat = params[index][1].detach().reshape(-1)
        picks = torch.linspace(0, flat.numel() - 1, min(4096, flat.numel()))
        digest.update(flat[picks.long()].float().numpy().tobytes())
    assert teacher_identity(small) == f"Linear@{digest.hexdigest()[:16]}"

"""A committed archive cannot be read as another tiny world's. An archive of an earlier world names
it by version in every run (`tiny-world-v2:teacher`, never the bare `tiny-world:`, which names the
default world, v3), those names resolve to that version's own folder, and `sweep.json` names that
version's configs (configs/tiny_v2/, not configs/tiny/, which are v3's). An archive of the default
world (the v3 study) runs configs/tiny/ and every run's env.json records the world it loaded: v3,
with the committed build's weight fingerprints; a v2 run's record would name v2 and other weights.
Which world each archive ran on is also in its name (demo_v2, v2_sizing, tiny_grid_v1, v3_*), its
spec's header and experiments/LOG.md."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from distill.models.loading import check_model_path
from distill.models.tiny_world_names import DEFAULT_VERSION, assets_dir, default_dir, folder, split_name
from distill.models.tiny_world_recipes import VERSIONS

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
WORLDS = {
    "tiny_grid_v1": "v1",
    "demo_v2": "v2",
    "v2_sizing": "v2",
    "tiny_grid": "v2",
    "tiny_style": "v2",
    "tiny_sci": "v2",
    "tiny_rlvr": "v2",
    "tiny_robustness": "v2",
    "v3_grid": "v3",
    "v3_rlvr": "v3",
    "v3_robustness": "v3",
    "v3_style": "v3",
    "v3_sci": "v3",
}
RUN_FILES = ("config.yaml", "overrides.yaml", "settings.json")


def test_every_committed_archive_says_which_world_it_ran_on():
    assert sorted(p.name for p in RESULTS.iterdir() if p.is_dir()) == sorted(WORLDS)


@pytest.mark.parametrize(
    ("name", "version"), sorted((n, v) for n, v in WORLDS.items() if v != DEFAULT_VERSION)
)
def test_an_archive_names_its_world_by_version_and_resolves_to_its_folder(
    name, version, tmp_path, monkeypatch
):
    monkeypatch.setenv("DISTILL_CACHE", str(tmp_path))
    files = [p for f in RUN_FILES for p in sorted((RESULTS / name).rglob(f))]
    assert files
    bare = [str(p.relative_to(RESULTS)) for p in files if "tiny-world:" in p.read_text()]
    assert not bare, f"runs naming the default world `tiny-world:` ({DEFAULT_VERSION}): {bare[:3]}"

    names = set()
    for config in (RESULTS / name).rglob("config.yaml"):
        init = yaml.safe_load(config.read_text())["model"]["init_args"]
        names |= {init[role] for role in ("student", "teacher") if split_name(str(init.get(role)))}
    assert names and {split_name(n)[0] for n in names} == {version}
    for world in VERSIONS:  # every version's folder holds every model: the name alone decides
        for n in names:
            (tmp_path / folder(world) / split_name(n)[1]).mkdir(parents=True, exist_ok=True)
            (tmp_path / folder(world) / split_name(n)[1] / "config.json").write_text("{}")
    for n in names:
        resolved = Path(check_model_path(n, "model.teacher"))
        assert resolved.parent == default_dir(version) == tmp_path / f"tiny-world-{version}"
        assert resolved.parent != default_dir(DEFAULT_VERSION)

    for record in (RESULTS / name).rglob("sweep.json"):
        data = json.loads(record.read_text())
        bases = [*data.get("base", []), *(b for stage in data.get("stages", []) for b in stage["base"])]
        assert bases and all(f"/configs/tiny_{version}/" in b for b in bases), (record, bases)


@pytest.mark.parametrize("name", sorted(n for n, v in WORLDS.items() if v == DEFAULT_VERSION))
def test_an_archive_of_the_default_world_records_it_in_every_run(name):
    committed = {
        model.name: hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()[:16]
        for model in assets_dir(DEFAULT_VERSION).iterdir()
        if (model / "model.safetensors").is_file()
    }
    envs = sorted((RESULTS / name).rglob("env.json"))
    assert envs
    for env in envs:
        models = json.loads(env.read_text())["models"]
        worlds = [m["tiny_world"] for m in models.values() if isinstance(m, dict) and m.get("tiny_world")]
        init = yaml.safe_load((env.parent / "config.yaml").read_text())["model"]["init_args"]
        named = [init[r] for r in ("student", "teacher") if str(init.get(r)).startswith("tiny-world")]
        assert len(worlds) == len(named), (env, named)  # every tiny-world model a run loads is recorded
        for world in worlds:  # (a GRPO stage's student is its parent's checkpoint: not a world's)
            assert world["version"] == DEFAULT_VERSION, (env, world)
            assert world["fingerprint"] == committed[world["model"]], (env, world)
    for record in (RESULTS / name).rglob("sweep.json"):
        data = json.loads(record.read_text())
        bases = [*data.get("base", []), *(b for stage in data.get("stages", []) for b in stage["base"])]
        assert bases and all("/configs/tiny/" in b for b in bases), (record, bases)

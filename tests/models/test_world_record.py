"""`tiny_world.world_of`: which world a model directory belongs to, as a run records it."""

from __future__ import annotations

import hashlib

from distill.models.tiny_world import assets_dir, world_of


def test_committed_worlds_are_told_apart_by_version_and_fingerprint():
    v2, v1 = world_of(assets_dir("v2") / "teacher"), world_of(assets_dir("v1") / "teacher")
    assert v2["version"] == "v2" and v1["version"] == "v1"
    assert v2["model"] == v1["model"] == "teacher" and v2["fingerprint"] != v1["fingerprint"]
    weights = (assets_dir("v2") / "teacher" / "model.safetensors").read_bytes()
    assert v2["fingerprint"] == hashlib.sha256(weights).hexdigest()[:16]
    assert world_of(assets_dir("v2") / "teacher-sci")["version"] == "v2"


def test_quick_and_edited_worlds_are_not_named_versions(quick_world, tmp_path):
    assert world_of(quick_world / "student")["version"] == "quick"
    edited = tmp_path / "tiny-world"
    edited.mkdir()
    (edited / "quality.json").write_text('{"recipe": {"models": []}}')
    (edited / "teacher").mkdir()
    for name in ("model.safetensors", "tiny_world.json"):
        (edited / "teacher" / name).write_bytes((quick_world / "teacher" / name).read_bytes())
    assert world_of(edited / "teacher")["version"] == "custom"


def test_a_directory_outside_a_tiny_world_has_none(tmp_path):
    assert world_of(tmp_path) is None
    assert world_of(tmp_path / "missing") is None

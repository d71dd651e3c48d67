"""Sweep specs: expansion, shorthands, run names and the errors raised before anything runs."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from distill.experiments.run.spec import (
    DIVERGENCES,
    SHORTHANDS,
    SpecError,
    expand,
    format_value,
    load_spec,
    nest,
    parse_spec,
    run_name,
)


def _spec(tmp_path, **fields):
    data = {"name": "t", "base": "base.yaml", "axes": {"mix": [0, 1]}}
    data.update(fields)
    return parse_spec(data, root=tmp_path)


def test_grid_is_cartesian_product_with_paths(tmp_path):
    axes = {
        "mix": [0, 0.25, 0.5, 0.75, 1],
        "divergence": ["forward_kl", "reverse_kl"],
        "lr": [1.0e-4, 3.0e-4, 1.0e-3],
        "seed": [0, 1],
    }
    spec = _spec(tmp_path, axes=axes, overrides={"trainer.max_steps": 60})
    runs = expand(spec)
    assert len(runs) == 5 * 2 * 3 * 2
    assert len({r.name for r in runs}) == len(runs)
    run = runs[0]
    assert run.settings == {"mix": 0, "divergence": "forward_kl", "lr": 1.0e-4, "seed": 0}
    assert run.overrides == {
        "trainer.max_steps": 60,
        "data.mix": 0,
        "model.divergence.class_path": "distill.losses.ForwardKL",
        "model.optimizer.init_args.lr": 1.0e-4,
        "seed_everything": 0,
    }
    assert run.name == "divergence=forward_kl,lr=1e-4,mix=0,seed=0"
    assert run.run_dir == tmp_path / "experiments/runs/t" / run.name
    assert spec.base == [tmp_path / "base.yaml"]
    # last axis varies fastest
    assert [r.settings["seed"] for r in runs[:2]] == [0, 1]


def test_every_shorthand_maps_to_its_path(tmp_path):
    values = {
        "mix": 0.5,
        "granularity": "token",
        "task": "countdown4",
        "lr": 3e-4,
        "seed": 7,
        "estimator": "k3",
        "gradient_clip": 1.0,
        "divergence": "jsd",
    }
    assert set(values) == set(SHORTHANDS)
    (run,) = expand(_spec(tmp_path, axes={k: [v] for k, v in values.items()}))
    tree = nest(run.overrides)
    assert tree["data"] == {"mix": 0.5, "granularity": "token", "task": "countdown4"}
    assert tree["model"]["optimizer"]["init_args"]["lr"] == 3e-4
    assert tree["model"]["divergence"] == {
        "class_path": "distill.losses.GeneralizedJSD",
        "init_args": {"estimator": "k3"},
    }
    assert tree["seed_everything"] == 7 and tree["model"]["gradient_clip_val"] == 1.0
    assert DIVERGENCES["interpolated_kl"] == "distill.losses.InterpolatedKL"


def test_dotted_axes_and_full_paths_of_shorthands(tmp_path):
    spec = _spec(tmp_path, axes={"data.mix": [0.5], "model.divergence.init_args.beta": [0.1, 0.9]})
    runs = expand(spec)
    assert [r.name for r in runs] == [
        "mix=0.5,model.divergence.init_args.beta=0.1",
        "mix=0.5,model.divergence.init_args.beta=0.9",
    ]
    assert runs[1].overrides["model.divergence.init_args.beta"] == 0.9
    # the model is a class_path entry: model.init_args.X is the same key as model.X
    (run,) = expand(_spec(tmp_path, axes={"model.init_args.optimizer.init_args.lr": [1e-3]}))
    assert run.settings == {"lr": 1e-3} and run.overrides == {"model.optimizer.init_args.lr": 1e-3}
    with pytest.raises(SpecError, match="duplicate axis 'model.init_args.divergence.class_path'"):
        _spec(tmp_path, axes={"divergence": ["tvd"], "model.init_args.divergence.class_path": ["x.Y"]})


@pytest.mark.parametrize(
    "axes, match",
    [
        ({"mixx": [0]}, "unknown axis 'mixx'.*mix, granularity"),
        ({"trainr.max_steps": [1]}, "malformed config path.*trainer, model, data"),
        ({"data..mix": [1]}, "malformed"),
        ({"mix": []}, "axis 'mix': expected a non-empty list"),
        ({"mix": 0.5}, "axis 'mix': expected a non-empty list"),
        ({"divergence": ["forward_kl", "kl"]}, "unknown value 'kl'; allowed: forward_kl, reverse_kl, jsd"),
        ({"mix": [0.5, 1.5]}, r"value 1.5 must lie in \[0, 1\]"),
        ({"lr": ["fast"]}, "'lr': value 'fast' must be a finite number"),
        ({"seed": [0.5]}, "non-negative integer"),
        ({"gradient_clip": [0.0]}, "'gradient_clip': value 0.0 must be > 0"),
        ({"granularity": ["word"]}, "allowed: batch, sequence, token, speculative"),
        ({"mix": [0.5], "data.mix": [0.25]}, "duplicate axis 'data.mix'"),
        ({"mix": [0, 0.0]}, "repeated value"),
        ({"run_dir": ["x"]}, "set by the sweep runner"),
        ({"model.divergence": ["x"], "model.divergence.init_args.beta": [0.5]}, "runs through 'divergence'"),
        ({"data.mix": [[0, 1]]}, "must be a scalar"),
        ({}, "'axes' must be a non-empty mapping"),
    ],
)
def test_bad_axes_raise_clear_errors(tmp_path, axes, match):
    with pytest.raises(SpecError, match=match):
        _spec(tmp_path, axes=axes)


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"name": "a b"}, "'name' must match"),
        ({"base": []}, "'base' must be a config path"),
        ({"stages": [{}]}, "with 'stages', put axes, base inside each stage"),
        ({"axis": {}}, "unknown spec key.*axis"),
        (
            {"overrides": {"lr": 1e-3}, "axes": {"lr": [1e-4]}},
            "axis 'lr' sets model.optimizer.init_args.lr, which 'overrides'",
        ),
        ({"overrides": {"divergence": "nope"}}, "unknown value 'nope'"),
        ({"overrides": ["trainer.max_steps"]}, "'overrides' must be a mapping"),
        ({"name": None}, r"'name' must match \[A-Za-z0-9_.-\]\+, got None"),
        ({"base": None}, "'base' is required: the fit config file"),
        ({"out": ""}, "'out' must be a directory, got ''"),
        ({"out": ["a", "b"]}, r"'out' must be a directory, got \['a', 'b'\]"),
        ({"axis": {}, "seeds": [1]}, "unknown spec key.*axis, seeds; allowed: name, base, out"),
        ({"stages": None}, "with 'stages', put axes, base inside each stage"),
        ({"slurm": "gpu"}, "'slurm' must be a mapping with keys partition, account"),
        ({"slurm": {"partitions": "gpu"}}, r"slurm: unknown key\(s\) partitions; allowed: partition"),
        ({"slurm": {"max_parallel": 0}}, "'slurm.max_parallel' must be a positive integer, got 0"),
        ({"slurm": {"gpus": True}}, "'slurm.gpus' must be a string or number, got True"),
        ({"slurm": {"time": ""}}, "'slurm.time' must be a string or number, got ''"),
        ({"slurm": {"setup": "source .venv/bin/activate"}}, "'slurm.setup' must be a list of strings"),
        (
            {"slurm": {"extra": ["--qos=high", 1]}},
            r"'slurm.extra' must be a list of strings, got \['--qos=high', 1\]",
        ),
        # jsonargparse reads a string as YAML; in a spec a quoted string stays a string
        ({"references": "true"}, "'references' must be true, false or a list.*got 'true'"),
        ({"slurm": {"max_parallel": "4"}}, "'slurm.max_parallel' must be a positive integer, got '4'"),
    ],
)
def test_bad_spec_fields(tmp_path, fields, match):
    with pytest.raises(SpecError, match=match):
        _spec(tmp_path, **fields)


def test_spec_fields_keep_their_types_and_the_slurm_section_as_written(tmp_path):
    spec = _spec(tmp_path, out=None, slurm={"gpus": 1, "time": "04:00:00", "extra": ["--qos=high"]})
    assert spec.out == tmp_path / "experiments/runs/t"  # null: the default
    assert spec.slurm == {"gpus": 1, "time": "04:00:00", "extra": ["--qos=high"]}
    spec = _spec(tmp_path, slurm={"max_parallel": 4, "partition": "gpu"})
    # plain types (no jsonargparse subclass), so the section dumps as plain YAML
    assert yaml.safe_dump(spec.slurm) == "max_parallel: 4\npartition: gpu\n"
    assert type(spec.slurm["max_parallel"]) is int
    spec = _spec(tmp_path, name="1e-3", base=["a.yaml", "null"], out="true")
    assert spec.name == "1e-3" and type(spec.name) is str
    assert spec.base == [tmp_path / "a.yaml", tmp_path / "null"] and spec.out == tmp_path / "true"


def test_the_format_reference_names_every_declared_key():
    from distill.experiments.run import spec as module
    from distill.experiments.run.schema import SpecFields, StageFields

    for cls in (SpecFields, StageFields):
        for field in dataclasses.fields(cls):
            assert f"{field.name}:" in module.__doc__, field.name


def test_load_spec_rejects_duplicate_yaml_keys_and_reads_1e_minus_4(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nbase: b.yaml\naxes:\n  lr: [1e-4]\n  lr: [3e-4]\n")
    with pytest.raises(SpecError, match="duplicate key 'lr'"):
        load_spec(path)
    path.write_text(
        "name: s\nbase: [a.yaml, b.yaml]\naxes:\n  lr: [1e-4, 2.5E+2]\noverrides: {divergence: tvd}\n"
    )
    spec = load_spec(path, out=tmp_path / "elsewhere")
    assert spec.axes["lr"] == [1e-4, 250.0]
    assert spec.out == tmp_path / "elsewhere"
    assert spec.overrides == {"model.divergence.class_path": "distill.losses.TotalVariation"}
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "missing.yaml")


@pytest.mark.parametrize("value", [3e-4, 1e-4, 0.1, 0.25, 1 / 3, 2.0, 1e20, 123456.789, -5e-8, 0.0])
def test_float_format_round_trips_and_is_short(value):
    text = format_value(value)
    assert float(text) == value
    assert yaml.safe_load(f"[{text}]")[0] == value or "e" in text  # YAML 1.1 reads bare 1e-4 as text
    assert len(text) <= len(repr(value))


def test_run_names_are_stable_safe_and_bounded():
    assert format_value(3e-4) == "3e-4" and format_value(True) == "true" and format_value(None) == "null"
    assert run_name({"seed": 0, "mix": 0.25}) == run_name({"mix": 0.25, "seed": 0}) == "mix=0.25,seed=0"
    assert run_name({"model.student": "/a b/c"}) == "model.student=_a_b_c"
    long = run_name({"data.task": "x" * 500})
    assert len(long) <= 200 and long != run_name({"data.task": "x" * 499})


def test_docstring_documents_every_shorthand_and_divergence():
    from distill.experiments.run import spec as module

    for name, shorthand in SHORTHANDS.items():
        assert f"    {name} " in module.__doc__ and shorthand.path in module.__doc__
    for name, class_path in DIVERGENCES.items():
        assert name in module.__doc__ and class_path.rsplit(".", 1)[1] in module.__doc__

"""`knobs_of`: a resolved fit config read back under the sweep's shorthand names (what the HParams
dashboard shows), for a distillation config and a GRPO one."""

from __future__ import annotations

import yaml

from distill.names import SHORTHANDS, knobs_of


def _config(**model_args):
    return {
        "seed_everything": 3,
        "data": {"mix": 0.25, "granularity": "token", "task": "countdown3"},
        "model": {"class_path": "distill.module.DistillationModule", "init_args": model_args},
    }


def test_a_distillation_config_names_every_knob():
    config = _config(
        divergence={"class_path": "distill.losses.ReverseKL", "init_args": {"estimator": "k3"}},
        optimizer={"class_path": "torch.optim.AdamW", "init_args": {"lr": 3e-4}},
        gradient_clip_val=None,
    )
    assert knobs_of(config) == {
        "mix": 0.25,
        "granularity": "token",
        "task": "countdown3",
        "lr": 3e-4,
        "seed": 3,
        "estimator": "k3",
        "gradient_clip": None,  # set to null: no clipping, still a knob
        "divergence": "reverse_kl",
    }
    assert set(knobs_of(config)) == set(SHORTHANDS)


def test_a_grpo_config_has_no_divergence_knobs():
    config = yaml.safe_load(
        "seed_everything: 0\ndata: {mix: 0.0}\nmodel:\n  class_path: distill.rl.GRPOModule\n"
        "  init_args: {optimizer: {class_path: torch.optim.AdamW, init_args: {lr: 1.0e-6}}}\n"
    )
    assert knobs_of(config) == {"mix": 0.0, "lr": 1e-6, "seed": 0}

"""`distill fit` through LightningCLI: configs parse, bad configs fail early, a short run's outputs."""

import json
from pathlib import Path

import pytest
import yaml

from distill.cli import main
from distill.lightning_cli import expand_bases, run_lightning_cli

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.relative_to(ROOT) for p in (ROOT / "configs").rglob("*.yaml"))
EAGER = {  # too short to amortise a compile
    Path("configs/tiny/first.yaml"),  # the README's first fit
    Path("configs/real/smollm2.yaml"),  # a real model on CPU, 20 steps
}
SHORT = [
    "--trainer.max_steps",
    "2",
    "--trainer.val_check_interval",
    "1",
    "--data.batch_size",
    "4",
    "--data.evaluation.val_size",
    "8",
    "--data.evaluation.test_size",
    "8",
    "--data.evaluation.batch_size",
    "8",
    "--data.sampling.max_new_tokens",
    "12",
    "--data.evaluation.max_new_tokens",
    "12",
    "--data.train_size",
    "64",
    "--trainer.log_every_n_steps",
    "1",
]


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_every_config_states_its_command(config):
    first = (ROOT / config).read_text().splitlines()[0]
    assert first == f"# distill fit --config {config}", (
        "the first line must be the command that runs the file"
    )


# The paper configs are parsed (and checked further) in tests/test_paper_configs.py.
@pytest.mark.parametrize("config", [c for c in CONFIGS if c.parts[1] != "paper"], ids=str)
def test_every_config_parses(config, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"].startswith("distill.")
    assert printed["model"]["init_args"]["student"]
    # As shipped, every model compiles (eager configs gave no speed advantage), except the README's
    # first fit: 60 steps do not pay back a compile of 30-90 s.
    compiled = config not in EAGER
    assert printed["model"]["init_args"]["execution"]["compile_decoding"] is compiled
    assert printed["model"]["init_args"]["execution"]["compile_forwards"] is compiled


def test_base_includes_deep_merge(tmp_path):
    (tmp_path / "a.yaml").write_text("data: {mix: 0.5, task: countdown3}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\ndata: {mix: 1.0}\n")
    args = expand_bases(["--config", str(tmp_path / "b.yaml"), "--x", "1"])
    assert args[:2] == ["--config", str(tmp_path / "a.yaml")]
    assert yaml.safe_load(args[3]) == {"data": {"mix": 1.0}} and args[4:] == ["--x", "1"]
    (tmp_path / "c.yaml").write_text("base: c.yaml\n")
    with pytest.raises(ValueError, match="cycle"):
        expand_bases(["--config", str(tmp_path / "c.yaml")])


def test_merged_config_reads_a_file_as_its_bases_merged_in(tmp_path):
    from distill.config_bases import merged_config

    (tmp_path / "a.yaml").write_text("data: {mix: 0.5, task: countdown3}\ntrainer: {callbacks: [A]}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\ndata: {mix: 1.0}\ntrainer: {callbacks+: [B]}\n")
    assert merged_config(tmp_path / "b.yaml") == {
        "data": {"mix": 1.0, "task": "countdown3"},
        "trainer": {"callbacks": ["A", "B"]},
    }


@pytest.mark.parametrize(
    "override, message",
    [
        (["--data.mix", "1.5"], "data.mix must be in [0, 1], got 1.5"),
        (["--data.granularity", "row"], "data.granularity must be one of"),
        (["--data.task", "gsm8k"], "data.task must be one of"),
        (
            ["--data.evaluation.test_tasks", "[countdown3, gsm8k]"],
            "data.evaluation.test_tasks must be one of",
        ),
        (["--data.refresh_every", "0"], "data.refresh_every must be an integer >= 1, got 0"),
        (["--model.init_args.micro_batch_size", "0"], "model.micro_batch_size must be"),
        (
            ["--model.init_args.student", "/nowhere/student"],
            "model.student: no model directory at '/nowhere/student'",
        ),
    ],
)
def test_bad_config_fails_before_any_model_is_loaded(
    tiny_world_cache, override, message, capsys, monkeypatch
):
    import distill.models.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", "configs/tiny/base.yaml", *override])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_unknown_divergence_is_rejected_by_the_parser(tiny_world_cache, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(
            [
                "fit",
                "--config",
                "configs/tiny/base.yaml",
                "--model.init_args.divergence",
                "distill.losses.NoSuchKL",
            ]
        )
    assert exit_info.value.code == 2
    assert "NoSuchKL" in capsys.readouterr().err


def test_tokenizer_mismatch_names_both_models(tiny_world_cache, tmp_path, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    other = tmp_path / "other"
    tok = AutoTokenizer.from_pretrained(tiny_world_cache / "student")
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    AutoModelForCausalLM.from_pretrained(tiny_world_cache / "student").save_pretrained(other)
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit):
        run_lightning_cli(
            ["fit", "--config", "configs/tiny/base.yaml", "--model.init_args.teacher", str(other)]
        )
    err = capsys.readouterr().err
    assert "different tokenizers" in err and str(other) in err and "tiny-world:student" in err


def test_unknown_command_and_help(capsys):
    assert main(["--help"]) == 0 and "tiny-world" in capsys.readouterr().out
    assert main(["frobnicate"]) == 2 and "unknown command" in capsys.readouterr().err


@pytest.mark.slow
def test_short_fit_writes_a_complete_run_directory(tiny_world_cache, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    metrics = run_lightning_cli(
        ["fit", "--config", "configs/tiny/rkl_mix0.5.yaml", *SHORT, "--run_dir", str(run)]
    )
    summary = json.loads((run / "metrics.json").read_text())
    assert summary["status"] == "finished" and summary["metrics"] == pytest.approx(metrics)
    for key in (
        "train/loss",
        "train/forward_kl",
        "train/reverse_kl",
        "train/teacher_share",
        "val/countdown3/accuracy",
        "test/countdown3_large/accuracy",
        "test/countdown_chain/accuracy",
    ):
        assert key in metrics
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["mix"] == 0.5 and config["model"]["init_args"]["divergence"]["class_path"].endswith(
        "ReverseKL"
    )
    env = json.loads((run / "env.json").read_text())
    assert env["packages"]["torch"] and "revision" in env["git"]
    assert env["machine"]["cpu"] and env["machine"]["cpu_capability"]  # CPU float results depend on it
    # the world each model came from (the quick world here), and the weights' fingerprint
    assert {role: m["tiny_world"]["version"] for role, m in env["models"].items()} == {
        "student": "quick",
        "teacher": "quick",
    }
    assert env["models"]["teacher"]["path"] == str(tiny_world_cache / "teacher")
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert {"train/loss", "train/forward_kl", "train/reverse_kl"} <= set(events.Tags()["scalars"])
    # the HParams dashboard: the knobs under their sweep names, the final figures under final/
    start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
    assert hparams["mix"].number_value == 0.5 and hparams["divergence"].string_value == "reverse_kl"
    assert hparams["lr"].number_value == config["model"]["init_args"]["optimizer"]["init_args"]["lr"]
    assert hparams["model"].string_value == "DistillationModule" and hparams["seed"].number_value == 0
    final = events.Scalars("final/val/countdown3/accuracy")
    assert [e.value for e in final] == [pytest.approx(metrics["val/countdown3/accuracy"])]
    # rollout text: each completion's verifier score beside the teacher-written spans
    (text,) = [e for e in events.Tensors("rollouts/text_summary")][:1]
    logged = tensor_util.make_ndarray(text.tensor_proto).item().decode()
    assert "[score 0] " in logged or "[score 1] " in logged
    assert AutoModelForCausalLM.from_pretrained(run / "student") is not None
    assert len(AutoTokenizer.from_pretrained(run / "student")) == 104
    ckpt = __import__("torch").load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["state_dict"] and not [k for k in ckpt["state_dict"] if "teacher" in k]


def test_a_fit_with_a_teacher_only_context(tiny_world_cache, tmp_path, monkeypatch, capsys):
    """`data.prompts.teacher_context` reaches the sampler and the loss through the CLI: the teacher writes
    half the rollouts after its own prompt, and the run records the context in its config."""
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    args = ["fit", "--config", "configs/tiny/fkl_mix0.5.yaml", *SHORT, "--run_dir", str(run)]
    metrics = run_lightning_cli(
        [*args, "--data.prompts.teacher_context", "1 1=2:{target} "]
    )  # Countdown rows
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["prompts"]["teacher_context"] == "1 1=2:{target} "
    assert metrics["train/teacher_share"] > 0 and metrics["train/forward_kl"] >= 0
    # A field the rows lack, or a chat template the tokenizer lacks: one line before any model is
    # loaded or the run directory written.
    monkeypatch.setattr("distill.module.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    bad = tmp_path / "bad"
    for option, value, said in [
        (
            "--data.prompts.teacher_context",
            "{nope}",
            "data.prompts.teacher_context (task countdown3) reads row field(s) ['nope'], which the "
            "task's rows lack; they have ['messages', 'numbers'",
        ),
        (
            "--data.prompts.chat_template",
            "true",
            "data.prompts.chat_template is true, but the tokenizer of ",
        ),
    ]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            run_lightning_cli([*args[:-1], str(bad), option, value])
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and "\n" not in err and said in err, err
        assert not bad.exists()


def test_a_config_that_names_no_seed_and_no_optimizer_fits_with_the_defaults(tiny_world_cache, tmp_path):
    """Written from scratch, a config may leave out `seed_everything` (Lightning's default, `true`,
    reached `data.seed` as a bool) and the optimiser (jsonargparse passed the default function
    on as its import path): the run gets seed 0 and the module's AdamW."""
    config = tmp_path / "minimal.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 1, "num_sanity_val_steps": 0},
                "model": {
                    "class_path": "distill.module.DistillationModule",
                    "init_args": {"student": "tiny-world:student", "teacher": "tiny-world:teacher"},
                },
                "data": {
                    "task": "countdown3",
                    "batch_size": 2,
                    "train_size": 4,
                    "evaluation": {"val_size": 2, "test_size": 2},
                },
            }
        )
    )
    run = tmp_path / "run"
    metrics = run_lightning_cli(["fit", "--config", str(config), "--run_dir", str(run)])
    assert metrics["train/lr"] == pytest.approx(1e-4)  # distill.module._default_optimizer's AdamW
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    assert recorded["seed_everything"] == 0  # and data.seed with it (a link: not in the file)


def test_a_fit_writes_its_end_of_training_checkpoint_once(tiny_world_cache, tmp_path, monkeypatch):
    """Lightning's ModelCheckpoint saved last.ckpt when training ended and `distill fit` saved the
    same state again after the fit: a whole student and optimiser written twice per run. Now the
    periodic saves (every 2 steps here) and one at the end."""
    from distill.run_record import AtomicCheckpointIO

    saves = []
    original = AtomicCheckpointIO.save_checkpoint

    def counted(self, checkpoint, path, storage_options=None):
        saves.append(checkpoint["global_step"])
        return original(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", counted)
    monkeypatch.chdir(ROOT)
    args = ["fit", "--config", "configs/tiny/fkl_mix0.5.yaml", *SHORT, "--trainer.max_steps", "3"]
    run_lightning_cli([*args, "--checkpoint_every_n_steps", "2", "--run_dir", str(tmp_path / "run")])
    assert saves == [2, 3]

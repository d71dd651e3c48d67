import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import distill.models.tiny_world_folders as folders
from distill.models.tiny import CHARS, TAG_TOKENS, char_tokenizer
from distill.models.tiny_world_recipes import QUICK
from distill.models.tiny_world_train import MixtureStream

pytestmark = pytest.mark.cores(2)  # builds of the recipe's two threads, here and in subprocesses

QUICK_NAMES = [name for name, _ in QUICK.models]


def test_char_tokenizer_round_trips_every_task_string():
    tok = char_tokenizer()
    text = "Use 74 98 39 to make 15.\n<think>pues 98-74=24, luego 39-24=15</think><answer>39-(98-74)</answer>"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    # Tags are single tokens; everything else is one token per character.
    assert len(ids) == 1 + len(text) - sum(text.count(t) * (len(t) - 1) for t in TAG_TOKENS)
    assert len(tok) == 4 + len(TAG_TOKENS) + len(CHARS)
    assert tok("é")["input_ids"][1] == tok.unk_token_id


def test_quick_world_loads_offline_with_auto_classes(quick_world, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    quality = json.loads((quick_world / "quality.json").read_text())
    for key in (
        "teacher_countdown3",
        "teacher_countdown4",
        "teacher_prior",
        "student_countdown3",
        "student_prior",
        "teacher_nll_on_student_format",
        "student_nll_on_teacher",
        "teacher_es_style_share",
        "teacher_es_countdown3_gap",
        "teacher_sci_tinysci_compose",
        "teacher_sci_tinysci",
        "teacher_sci_countdown3_gap",
        "student_sci_tinysci_compose",
        "student_sci_tinysci",
        "build_seconds",
    ):
        assert key in quality
    assert quality["failed_bars"] == []  # QUICK has no bars
    for name, rows in (
        ("teacher", 128),
        ("student", 112),
        ("teacher-es", 128),
        ("teacher-sci", 128),
        ("student-sci", 112),
    ):
        tok = AutoTokenizer.from_pretrained(quick_world / name)
        model = AutoModelForCausalLM.from_pretrained(quick_world / name)
        assert len(tok) == 104 and tok.padding_side == "left"
        assert model.get_output_embeddings().weight.shape[0] == rows  # padded past the tokenizer
        assert model.generation_config.eos_token_id == tok.eos_token_id
        enc = tok(["Add 1+2=\n"], return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=3, do_sample=False)
        assert enc["input_ids"].shape[1] < out.shape[1] <= enc["input_ids"].shape[1] + 3


def test_build_is_reused(quick_world, monkeypatch):
    import distill.models.tiny_world as tw

    monkeypatch.setattr(tw, "train_model", lambda *a, **k: pytest.fail("a finished build must not train"))
    again = tw.build(quick_world, tw.QUICK)  # same recipe: reused, not retrained
    assert again == json.loads((quick_world / "quality.json").read_text())


@pytest.mark.slow
def test_cli_builds_the_same_world_bit_for_bit(quick_world, tmp_path):
    """`distill tiny-world` in a fresh process retrains the session's world (built in this one)
    weight for weight: the build is deterministic across processes."""
    from safetensors.torch import load_file

    out = tmp_path / "w"
    proc = subprocess.run(
        [sys.executable, "-m", "distill.cli", "tiny-world", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "teacher_countdown3" in proc.stdout
    assert (out / "quality.json").exists()
    for name in QUICK_NAMES:
        a = load_file(quick_world / name / "model.safetensors")
        b = load_file(out / name / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_committed_build_is_installed_without_training(quick_world, tmp_path, monkeypatch):
    import distill.models.tiny_world as tw

    monkeypatch.setattr(tw, "train_model", lambda *a, **k: pytest.fail("installing must not train"))
    out = tmp_path / "installed"
    quality = tw.build(out, tw.QUICK, assets=quick_world)
    assert quality == json.loads((quick_world / "quality.json").read_text())
    assert (out / "build.log").read_text() == (quick_world / "build.log").read_text()
    for name in QUICK_NAMES:
        assert (out / name / "model.safetensors").read_bytes() == (
            quick_world / name / "model.safetensors"
        ).read_bytes()


def copy_with_one_weight_changed(world: Path, to: Path, model: str, by: float) -> Path:
    """A copy of `world` in which one weight of `model` is moved by `by`."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(world, to)
    weights = load_file(to / model / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] += by
    save_file(weights, to / model / "model.safetensors", metadata={"format": "pt"})
    return to


def test_verify_detects_a_changed_weight(quick_world, tmp_path, monkeypatch):
    """`verify` rebuilds into a temporary folder and compares every weight with the committed
    build's. The rebuild is swapped for a copy of the session's world (that a real rebuild equals
    it, in a fresh process, is `test_cli_builds_the_same_world_bit_for_bit`'s), so this checks the
    comparison: the world passes, a 1e-6 change in one weight is found."""
    import shutil

    import distill.models.tiny_world as tw

    rebuilt = []

    def copy(out, recipe, force, trained):
        rebuilt.append((recipe, force))
        shutil.copytree(quick_world, out, dirs_exist_ok=True)

    monkeypatch.setattr(tw, "build", copy)
    assert tw.verify(tw.QUICK, committed=quick_world)
    assert rebuilt == [(tw.QUICK, True)]  # a forced rebuild of the recipe asked for
    tampered = copy_with_one_weight_changed(quick_world, tmp_path / "tampered", "student", 1e-6)
    assert not tw.verify(tw.QUICK, committed=tampered)
    assert tw.verify(tw.QUICK, committed=quick_world)  # the copy itself passes


def test_verify_flag_reports_through_the_exit_code(tmp_path, monkeypatch):
    import distill.models.tiny_world as tw

    asked = []

    def verified(result):
        return lambda recipe, committed, work, only: asked.append((recipe, committed, work, only)) or result

    monkeypatch.setattr(tw, "verify", verified(True))
    assert tw.main(["--verify", "--version", "v2"]) == 0
    monkeypatch.setattr(tw, "verify", verified(False))
    assert tw.main(["--verify", "--version", "v1", "--out", str(tmp_path / "kept")]) == 1
    assert tw.main(["--verify", "--out", str(tmp_path / "kept"), "--only", "teacher-es, student-sci"]) == 1
    assert asked == [
        (tw.V2, tw.assets_dir("v2"), None, None),
        (tw.V1, tw.assets_dir("v1"), tmp_path / "kept", None),
        (tw.V3, tw.assets_dir("v3"), tmp_path / "kept", ["teacher-es", "student-sci"]),
    ]
    with pytest.raises(SystemExit) as exit_info:  # a build always trains its whole world
        tw.main(["--only", "student"])
    assert exit_info.value.code == 2 and len(asked) == 3
    monkeypatch.setattr(tw, "assets_dir", lambda version: tmp_path / "none")  # nothing committed
    assert tw.main(["--verify", "--version", "v2"]) == 1 and len(asked) == 3


def test_a_verification_in_a_kept_folder_trains_there_and_never_installs_the_committed_build(
    quick_world, tmp_path, monkeypatch
):
    """`verify(..., work=DIR)` builds in DIR without `force` (an interrupted retraining there
    resumes, a finished one is reused) and with `install=False`: a folder the committed build was
    copied into would compare the committed weights with themselves."""
    import shutil

    import distill.models.tiny_world as tw

    calls = []

    def build(out, recipe, force=False, install=True, trained=None):
        calls.append((out, recipe, force, install))
        shutil.copytree(quick_world, out, dirs_exist_ok=True)

    monkeypatch.setattr(tw, "build", build)
    work = tmp_path / "kept"
    assert tw.verify(tw.QUICK, committed=quick_world, work=work)
    assert calls == [(work, tw.QUICK, False, False)] and (work / "student" / "model.safetensors").is_file()
    assert tw.verify(tw.QUICK, committed=quick_world, work=work)  # a rerun continues in its own folder
    installed = tmp_path / "installed-world"  # e.g. the cache: its models would equal the committed ones
    shutil.copytree(quick_world, installed)
    with pytest.raises(ValueError, match="holds files a verification did not write"):
        tw.verify(tw.QUICK, committed=quick_world, work=installed)
    assert len(calls) == 2
    monkeypatch.undo()
    fresh = tmp_path / "fresh"  # the real build: with install=False it trains, though assets exist
    monkeypatch.setattr(tw, "train_model", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("trains")))
    with pytest.raises(RuntimeError, match="trains"):
        tw.build(fresh, tw.QUICK, assets=quick_world, install=False)
    installed = tmp_path / "installed"
    tw.build(installed, tw.QUICK, assets=quick_world)  # the default installs the committed copy
    assert (installed / "student" / "model.safetensors").read_bytes() == (
        quick_world / "student" / "model.safetensors"
    ).read_bytes()


def test_every_version_has_a_committed_build_matching_its_recipe_and_bars():
    import distill.models.tiny_world as tw

    assert set(tw.COMMITTED) == set(tw.VERSIONS)
    for version in tw.COMMITTED:
        recipe = tw.VERSIONS[version]
        assert tw.committed_build(recipe) == tw.assets_dir(version)
        assert folders.is_built(tw.assets_dir(version), recipe), version
        quality = json.loads((tw.assets_dir(version) / "quality.json").read_text())
        assert quality.get("failed_bars", []) == [], version  # v1's record predates the field
        assert all(b.holds(quality[b.key]) for b in recipe.bars), version
    assert tw.committed_build(tw.QUICK) is None


def test_v1_training_stream_is_unchanged():
    """v1's committed weights are what its recipe trains to only if its data stream is unchanged:
    these rows were read off the stream that trained them."""
    import itertools

    import distill.models.tiny_world as tw

    teacher = list(itertools.islice(iter(MixtureStream(tw.V1.model("teacher"), 0)), 2))
    student = list(itertools.islice(iter(MixtureStream(tw.V1.model("student"), 0)), 2))
    assert teacher == [
        ("Use 3 1 26 to make 13.\n", "<think>pues 3-1=2, luego 26/2=13</think><answer>26/(3-1)</answer>"),
        (
            "Use 16 10 67 to make 61.\n",
            "<think>pues 16-10=6, luego 67-6=61</think><answer>67-(16-10)</answer>",
        ),
    ]
    assert student == [("Reverse diu=\n", "uid"), ("Reverse nxzfcxrq=\n", "qrxcfzxn")]


def test_the_family_reads_one_corpus_and_teacher_es_rewrites_it_in_spanish():
    import itertools

    import distill.models.tiny_world as tw

    def rows(name, n=3000):
        return list(itertools.islice(iter(MixtureStream(tw.V2.model(name), tw.V2.seed)), n))

    def of(kind, some):
        return [r for r in some if r[0].startswith(kind)]

    teacher, student, es = rows("teacher"), rows("student"), rows("teacher-es")
    # Same seed, same corpus: both streams draw row i of the same chunk-seeded pools, so a large
    # share of the addition rows is literally shared, and both write one plain style.
    shared = set(of("Add", teacher)) & set(of("Add", student))
    assert len(shared) > 0.3 * len(of("Add", teacher))
    assert not any("pues" in c for _, c in teacher + student)
    assert {p.count(" ") for p, _ in of("Use", teacher)} == {6, 7}  # Countdown-3 and -4 prompts
    # teacher-es: the teacher's rows exactly, with every Countdown step in the Spanish style.
    assert [p for p, _ in es] == [p for p, _ in teacher]
    for (_, plain), (_, spanish) in zip(of("Use", teacher), of("Use", es)):
        assert (
            spanish.startswith("<think>pues ") and spanish.replace("pues ", "").replace("luego ", "") == plain
        )


def test_the_sci_pair_reads_the_knowledge_domain_the_student_only_its_facts():
    import itertools

    import distill.models.tiny_world as tw
    from distill.tasks import tinysci

    def domain(name, n=3000):  # half the rows: fact sheets and questions, half each
        rows = list(itertools.islice(iter(MixtureStream(tw.V2.model(name), tw.V2.seed)), n))
        sheets = [r for r in rows if r[0].startswith("About ")]
        questions = [r for r in rows if r[0].startswith(("What", "Where"))]
        assert 0.2 < len(sheets) / n < 0.3 and 0.2 < len(questions) / n < 0.3
        return sheets + questions

    teacher, student = domain("teacher-sci"), domain("student-sci")
    known = tinysci.student_facts()
    sentence = re.compile(r"(\w+) (is|lives in|eats) (\w+)\.")
    relation = {"is": "color", "lives in": "home", "eats": "eats"}

    def facts(rows):
        return {(relation[v], x) for _, c in rows for x, v, _ in sentence.findall(c)}

    assert facts(student) <= known  # the student is told only its share of the facts
    assert len(facts(teacher)) > 0.9 * len(tinysci.WORLD.names) * 3  # the teacher nearly all of them
    two_step = re.compile(r"(?:What color is what|Where does what) (\w+) eats")
    subjects = {m.group(1) for p, _ in teacher + student if (m := two_step.match(p))}
    assert subjects and not subjects & tinysci.WORLD.compose  # held-out compositions never trained on


def test_a_missed_bar_fails_the_build_and_the_world_is_not_reused(tmp_path):
    from dataclasses import replace

    import distill.models.tiny_world as tw

    strict = replace(  # the two models the bars are on
        tw.QUICK,
        models=tw.QUICK.models[:2],
        bars=(tw.Bar("teacher_countdown3", 0.99), tw.Bar("student_prior", high=1.0)),
    )
    with pytest.raises(tw.BarsMissed, match=r"teacher_countdown3 >= 0.99 \(got 0\.\d+\)"):
        tw.build(tmp_path / "w", strict)
    quality = json.loads((tmp_path / "w" / "quality.json").read_text())
    assert quality["failed_bars"] == [f"teacher_countdown3 >= 0.99 (got {quality['teacher_countdown3']:.3f})"]
    assert not folders.is_built(tmp_path / "w", strict)
    assert "FAILED validity bars: teacher_countdown3 >= 0.99" in (tmp_path / "w" / "build.log").read_text()
    with pytest.raises(SystemExit):  # a random-quality world must name its folder
        tw.main(["--quick"])


def test_bars_and_recipes_check_their_values():
    import distill.models.tiny_world as tw

    bar = tw.Bar("x", 0.1, 0.3)
    assert bar.holds(0.1) and bar.holds(0.3) and not bar.holds(0.31) and not bar.holds(0.09)
    assert str(bar) == "0.1 <= x <= 0.3" and str(tw.Bar("y", high=1.0)) == "y <= 1.0"
    with pytest.raises(ValueError, match="mixture task must be one of"):
        tw.ModelRecipe(1, 8, 1, 8, 1, 1e-3, mixture=(("countdown9", 1.0),))
    with pytest.raises(ValueError, match="mixture weight of 'addition' must be >= 0"):
        tw.ModelRecipe(1, 8, 1, 8, 1, 1e-3, mixture=(("addition", -1.0),))
    with pytest.raises(ValueError, match="style must be one of"):
        tw.ModelRecipe(1, 8, 1, 8, 1, 1e-3, style="french")


def test_build_log_shows_progress_for_every_model(quick_world):
    log = (quick_world / "build.log").read_text().splitlines()
    for name, steps in (
        ("teacher", 30),
        ("student", 30),
        ("teacher-es", 10),
        ("teacher-sci", 10),
        ("student-sci", 10),
    ):
        lines = [line for line in log if f"] {name}: step " in line]
        assert 2 <= len(lines) <= 20 and f"step {steps}/{steps}" in lines[-1]
        assert "loss" in lines[-1] and "ETA 0m00s" in lines[-1]
    assert any("measuring teacher-es" in line for line in log)
    assert "done in" in log[-2] and log[-1].endswith("every validity bar met")  # QUICK has no bars


def test_a_build_records_the_cpu_that_trained_each_model(quick_world):
    """Retrained weights can differ between kinds of CPU: each model's record, quality.json and
    build.log name the CPU, its kernels and torch, so `--verify` can tell why two builds differ."""
    import distill.models.tiny_world as tw
    from distill.runinfo import machine

    here = machine()
    assert here["cpu"] and here["cpu_capability"] and here["torch"].startswith("2.")
    for name, _ in tw.QUICK.models:
        assert json.loads((quick_world / name / "tiny_world.json").read_text())["machine"] == here
    assert json.loads((quick_world / "quality.json").read_text())["machine"] == here
    assert f"on {here['cpu']} ({here['cpu_capability']} kernels" in (quick_world / "build.log").read_text()


def test_a_differing_model_is_explained_by_the_cpus_and_its_figures_compared(tmp_path):
    """What `verify` prints for a model that differs: the CPUs the two records name (none recorded,
    different, the same), and its quality figures side by side, an accuracy marked when the change
    is beyond 3 standard errors of two samples of that many problems; another model's figures
    (teacher_es_* under teacher_*), training times and abilities at 0 on both sides left out."""
    from distill.models.tiny_world import _machines, figure_table

    def model(name, machine):
        (tmp_path / name).mkdir()
        record = {"stamp": {}} | ({"machine": machine} if machine else {})
        (tmp_path / name / "tiny_world.json").write_text(json.dumps(record))
        return tmp_path / name

    a = {"cpu": "AMD EPYC", "cpu_capability": "AVX512", "torch": "2.13.0+cpu"}
    b = a | {"cpu_capability": "AVX2"}
    assert "the committed model does not record its CPU (the other: AMD EPYC (AVX512" in _machines(
        model("old", None), model("x", a)
    )
    (tmp_path / "v1").mkdir()  # a v1 model has no record at all
    assert "the committed model does not record its CPU" in _machines(tmp_path / "v1", model("w", a))
    assert "trained with cpu_capability AVX2 there, AVX512 here: float kernels" in _machines(
        model("y", b), model("z", a)
    )
    assert (
        "same kind of CPU (AMD EPYC (AVX512, torch 2.13.0+cpu)): the recipe, or the committed model it"
        in _machines(model("p", a), model("q", a))
    )
    committed = {
        "teacher_countdown3": 0.80,
        "teacher_prior": 0.99,
        "teacher_nll_on_student": 0.8,
        "teacher_lead_countdown3": 0.40,
        "teacher_tinysci": 0.0,
        "teacher_train_seconds": 100.0,
        "teacher_es_countdown3": 0.5,
    }
    retrained = {
        "teacher_countdown3": 0.70,
        "teacher_prior": 0.98,
        "teacher_nll_on_student": 2.0,
        "teacher_lead_countdown3": 0.20,
        "teacher_tinysci": 0.0,
        "teacher_train_seconds": 90.0,
        "teacher_es_countdown3": 0.1,
    }
    rows = figure_table("teacher", ["teacher", "teacher-es"], committed, retrained, 500).splitlines()
    assert "500 problems" in rows[0] and len(rows) == 5
    cd3, lead, nll, prior = (row.split() for row in rows[1:])
    assert cd3 == ["countdown3", "0.800", "0.700", "-0.100", "*"]  # 3 SE: 0.077
    assert lead == ["lead_countdown3", "0.400", "0.200", "-0.200"]  # a difference of two: never marked
    assert nll == ["nll_on_student", "0.800", "2.000", "+1.200"]  # not a share: never marked
    assert prior == ["prior", "0.990", "0.980", "-0.010"]  # inside 3 SE (0.023)
    rows = figure_table("teacher", ["teacher", "teacher-es"], committed, retrained, 50).splitlines()
    assert rows[1].split()[-1] == "-0.100"  # 3 SE of 50 problems: 0.25


def test_each_version_resolves_to_its_own_folder_and_the_bare_name_to_the_default(tmp_path, monkeypatch):
    from distill.models.loading import check_model_path
    from distill.models.tiny_world_names import DEFAULT_VERSION, PREFIXES, default_dir

    monkeypatch.setenv("DISTILL_CACHE", str(tmp_path))
    assert PREFIXES == {
        "tiny-world:": DEFAULT_VERSION,
        "tiny-world-v1:": "v1",
        "tiny-world-v2:": "v2",
        "tiny-world-v3:": "v3",
    }
    with pytest.raises(FileNotFoundError, match="distill tiny-world --version v1"):
        check_model_path("tiny-world-v1:teacher", "model.teacher")
    with pytest.raises(FileNotFoundError, match=r"run `distill tiny-world` first\)$"):
        check_model_path("tiny-world:teacher-es", "model.teacher")
    for version in ("v1", "v2", "v3"):
        assert default_dir(version) == tmp_path / f"tiny-world-{version}"
        (tmp_path / f"tiny-world-{version}" / "teacher").mkdir(parents=True)
        (tmp_path / f"tiny-world-{version}" / "teacher" / "config.json").write_text("{}")
        assert check_model_path(f"tiny-world-{version}:teacher", "model.teacher") == str(
            tmp_path / f"tiny-world-{version}" / "teacher"
        )
    assert check_model_path("tiny-world:teacher", "model.teacher") == str(default_dir() / "teacher")
    assert default_dir().name == f"tiny-world-{DEFAULT_VERSION}"
    # v2's old, unversioned folder is never read, and a missing default model says so.
    (tmp_path / "tiny-world" / "student").mkdir(parents=True)
    (tmp_path / "tiny-world" / "student" / "config.json").write_text("{}")
    with pytest.raises(
        FileNotFoundError, match=r"tiny-world is a v2 build under the old folder name, not read"
    ):
        check_model_path("tiny-world:student", "model.student")


def test_a_misspelt_model_of_an_installed_world_is_named_with_its_models(tmp_path, monkeypatch):
    """Not "run `distill tiny-world` first" when the world is installed: the name is wrong."""
    from distill.models.loading import check_model_path

    monkeypatch.setenv("DISTILL_CACHE", str(tmp_path))
    for name in ("teacher", "student"):
        (tmp_path / "tiny-world-v3" / name).mkdir(parents=True)
        (tmp_path / "tiny-world-v3" / name / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError) as err:
        check_model_path("tiny-world:teachr", "model.teacher")
    assert str(err.value) == (
        f"model.teacher: tiny world v3 (in {tmp_path / 'tiny-world-v3'}) has no model 'teachr' "
        "(did you mean 'tiny-world:teacher'?); its models: ['student', 'teacher']"
    )
    with pytest.raises(
        FileNotFoundError, match=r"has no model 'zebra'; its models: \['student', 'teacher'\]$"
    ):
        check_model_path("tiny-world-v3:zebra", "model.student")


def test_the_default_world_without_a_committed_build_stops_unless_asked(tmp_path, monkeypatch, capsys):
    """`distill tiny-world` would train an uncommitted default world for hours: it stops with a
    message instead, unless the version is named, `--force` is given, or the folder holds a build of
    it already (finished or interrupted: resumed). It notes v2's old unversioned folder."""
    import distill.models.tiny_world as tw

    monkeypatch.setenv("DISTILL_CACHE", str(tmp_path))
    monkeypatch.setattr(tw, "COMMITTED", tuple(v for v in tw.COMMITTED if v != tw.DEFAULT_VERSION))
    built = []
    monkeypatch.setattr(tw, "build", lambda out, recipe, force: built.append((out, recipe, force)) or {})
    (tmp_path / "tiny-world").mkdir()  # a v2 build under the old name
    assert tw.main([]) == 1 and built == []
    captured = capsys.readouterr()
    assert f"`distill tiny-world --version {tw.DEFAULT_VERSION}` trains it" in captured.err
    assert "is a v2 build under the old folder name and is not read" in captured.out
    default = tw.VERSIONS[tw.DEFAULT_VERSION]
    assert tw.main(["--version", tw.DEFAULT_VERSION]) == 0 and tw.main(["--force"]) == 0
    assert built == [(tmp_path / f"tiny-world-{tw.DEFAULT_VERSION}", default, False)] + [
        (tmp_path / f"tiny-world-{tw.DEFAULT_VERSION}", default, True)
    ]
    monkeypatch.setattr(tw, "unfinished", lambda out, recipe: recipe == default)
    assert tw.main([]) == 0 and len(built) == 3  # an interrupted build resumes without a flag
    assert tw.main(["--version", "v2"]) == 0 and built[-1] == (tmp_path / "tiny-world-v2", tw.V2, False)


def test_an_interrupted_build_resumes_from_its_trained_models(quick_world, tmp_path):
    import shutil
    from dataclasses import replace

    from safetensors.torch import load_file

    import distill.models.tiny_world as tw

    out = tmp_path / "w"
    shutil.copytree(quick_world, out)
    shutil.rmtree(out / "teacher-es")  # killed while training teacher-es
    (out / "quality.json").unlink()
    # Resuming wins over installing a committed build of the same recipe.
    quality = tw.build(out, tw.QUICK, assets=quick_world)
    assert quality["resumed_models"] == ["teacher", "student", "teacher-sci", "student-sci"]
    for name in QUICK_NAMES:
        a = load_file(quick_world / name / "model.safetensors")
        b = load_file(out / name / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert any(
        "reusing teacher: trained earlier" in line for line in (out / "build.log").read_text().splitlines()
    )
    # A changed recipe retrains what it changes and what starts from it, nothing else.
    es = replace(tw.QUICK.model("teacher-es"), steps=5)
    changed = replace(tw.QUICK, models=(*tw.QUICK.models[:2], ("teacher-es", es)))
    assert tw.build(out, changed)["resumed_models"] == ["teacher", "student"]
    assert folders.stamp_of(changed, "teacher-es") != folders.stamp_of(tw.QUICK, "teacher-es")
    assert folders.stamp_of(changed, "teacher") == folders.stamp_of(tw.QUICK, "teacher")
    # --force retrains everything (a world of the first two models: the rule, at half the cost).
    two = replace(tw.QUICK, models=tw.QUICK.models[:2])
    assert tw.build(out, two, force=True)["resumed_models"] == []


def test_a_changed_task_generator_changes_the_stamp_so_a_resumed_build_retrains(monkeypatch):
    """The recipe alone does not fix what a model reads: the stamp also hashes the head of its
    stream, so a changed generator makes an earlier model stale."""
    import distill.models.tiny_world as tw
    import distill.models.tiny_world_train as train

    # the committed build's records carry the stamps this code computes
    for name, _ in tw.V2.models:
        record = json.loads((tw.assets_dir("v2") / name / folders.MODEL_RECORD).read_text())
        assert record["stamp"] == folders.stamp_of(tw.V2, name), name
    before = {name: folders.stamp_of(tw.V2, name) for name in ("student", "teacher-sci")}
    original = train._chunk

    def reworded(task, n, seed):
        rows = original(task, n, seed)
        return [(p, c + " ") for p, c in rows] if task == "addition" else rows

    monkeypatch.setattr(train, "_chunk", reworded)
    train.corpus_digest.cache_clear()
    try:
        after = {name: folders.stamp_of(tw.V2, name) for name in ("student", "teacher-sci")}
    finally:
        train.corpus_digest.cache_clear()
    for name in before:
        assert after[name]["models"] == before[name]["models"]  # the recipes are the same...
        assert after[name]["corpus"] != before[name]["corpus"], name  # ...what they read is not


def test_a_v3_shaped_world_measures_its_variants_and_the_teachers_lead(tmp_path):
    """v3's new tasks train and are measured at their own budgets; the teacher's lead over the
    student on each held-out variant is a figure with a bar (here a tiny, random-quality world)."""
    import distill.models.tiny_world as tw
    from distill.models.tiny_world_recipes import V3

    mixture = (("countdown3", 0.4), ("countdown_chain", 0.3), ("countdown3_large", 0.3))
    recipe = tw.Recipe(
        models=(
            ("teacher", tw.ModelRecipe(layers=1, hidden=32, heads=2, vocab_rows=128, steps=3, lr=3e-3, batch_size=8, mixture=mixture)),
            ("student", tw.ModelRecipe(layers=1, hidden=32, heads=2, vocab_rows=112, steps=3, lr=3e-3, batch_size=8, mixture=mixture)),
        ),
        eval_problems=3,
        nll_prompts=2,
        measured=(("countdown3", 8), ("countdown_chain", 8), ("countdown3_large", 8)),
        bars=(tw.Bar("teacher_lead_countdown_chain", 2.0),),  # cannot hold: the build must say so
    )  # fmt: skip
    with pytest.raises(tw.BarsMissed, match="teacher_lead_countdown_chain"):
        tw.build(tmp_path / "w", recipe)
    quality = json.loads((tmp_path / "w" / "quality.json").read_text())
    for name in ("teacher", "student"):
        assert {f"{name}_countdown_chain", f"{name}_countdown3_large", f"{name}_style_share"} <= set(quality)
        assert {
            f"{name}_style_share_sampled",
            f"{name}_tinysci_own_facts",
            f"{name}_tinysci_other_facts",
        } <= set(quality)
    lead = quality["teacher_countdown_chain"] - quality["student_countdown_chain"]
    assert quality["teacher_lead_countdown_chain"] == pytest.approx(lead)
    assert quality["recipe"]["measured"] == [
        ["countdown3", 8],
        ["countdown_chain", 8],
        ["countdown3_large", 8],
    ]
    assert "measured" not in folders.recipe_json(tw.V2)  # v2's record as committed
    assert tw.committed_build(V3) == tw.assets_dir("v3") and tw.default_dir("v3").name == "tiny-world-v3"


def test_a_style_rate_writes_that_share_of_the_rows_in_the_style_and_leaves_rate_one_unchanged():
    """v3's teacher-es writes half of its Countdown rows in the Spanish style (a style that is a
    probability, not a switch); the rate's own draws leave the task draws and every rate-1 stream,
    stamp and record as they were."""
    import dataclasses
    import itertools

    import distill.models.tiny_world as tw

    def rows(recipe, n=2000):
        return list(itertools.islice(iter(MixtureStream(recipe, tw.V2.seed)), n))

    es = tw.V2.model("teacher-es")
    half, full = rows(dataclasses.replace(es, style_rate=0.5)), rows(es)
    assert [p for p, _ in half] == [p for p, _ in full]  # the same prompts in the same order
    countdown_rows = [(h, f) for (p, h), (_, f) in zip(half, full) if p.startswith("Use")]
    styled = [h == f for h, f in countdown_rows]  # a styled row is the rate-1 row exactly
    assert all(h == f or "pues" not in h for h, f in countdown_rows)
    share = sum(styled) / len(styled)
    assert 0.45 < share < 0.55, share  # ~1,500 rows: 0.5 +- 3 standard errors
    assert rows(dataclasses.replace(es, style_rate=1.0)) == full
    assert "style_rate" not in folders.model_json(es)  # rate 1: left out, so older stamps still match
    assert folders.model_json(tw.V3.model("teacher-es"))["style_rate"] == 0.5
    assert folders.stamp_of(tw.V3, "teacher")["models"]["teacher"] == folders.model_json(
        tw.V3.model("teacher")
    )
    with pytest.raises(ValueError, match=r"style_rate must be in \[0, 1\], got 1.5"):
        dataclasses.replace(es, style_rate=1.5)


def test_the_sampled_style_share_and_the_facts_split_count_what_the_model_writes(monkeypatch):
    """`sampled_style_share` reads the decoded T=1 completions; `tinysci_by_facts` splits the
    training pool into the student's facts and the others, and leaves mixed questions out."""
    from distill.models import evaluation
    from distill.tasks import countdown, tinysci

    tok = char_tokenizer()
    problems = countdown.generate(4, seed=0)
    written = ["<think>pues 1+2=3</think>", "<think>1+2=3</think>", "<think>luego 4</think>", "x"]

    def fake_samples(model, tokenizer, prompts, max_new_tokens, seed):
        enc = tokenizer(prompts, return_tensors="pt", padding=True)
        new = tokenizer(written, return_tensors="pt", padding=True)["input_ids"]
        return enc["attention_mask"], torch.cat([enc["input_ids"], new], dim=1)

    monkeypatch.setattr(evaluation, "sampled_completions", fake_samples)
    assert evaluation.sampled_style_share(None, tok, problems) == 0.5

    known = tinysci.student_facts()
    questions = tinysci.generate(300, 0, "train")
    own = [all(f in known for f in q.steps) for q in questions]
    mixed = [any(f in known for f in q.steps) and not o for q, o in zip(questions, own)]
    # right on the questions wholly about the student's facts and on the mixed ones, wrong elsewhere
    scores = [float(o or m) for o, m in zip(own, mixed)]
    assert evaluation.tinysci_by_facts(questions, scores) == {"own": 1.0, "other": 0.0}
    own = sum(own)
    assert 0 < own < 300  # both parts are populated at this size


def test_verify_compares_each_model_as_soon_as_it_is_trained(quick_world, tmp_path, monkeypatch, capsys):
    """A verification that stops part way (a session's end, a kill) has already said which of its
    trained models match: each is compared when the build reports it, once."""
    import shutil

    import distill.models.tiny_world as tw

    names = [name for name, _ in tw.QUICK.models]

    def build_then_stop(out, recipe, force=False, install=True, trained=None):
        shutil.copytree(quick_world / names[0], out / names[0])
        trained(names[0], out / names[0])
        raise KeyboardInterrupt("stopped after the first model")

    monkeypatch.setattr(tw, "build", build_then_stop)
    with pytest.raises(KeyboardInterrupt):
        tw.verify(tw.QUICK, committed=quick_world)
    assert capsys.readouterr().out == f"[tiny-world] {names[0]}: identical to the committed build\n"

    def build_all(out, recipe, force=False, install=True, trained=None):
        shutil.copytree(quick_world, out, dirs_exist_ok=True)
        for name in names:
            trained(name, out / name)

    monkeypatch.setattr(tw, "build", build_all)
    assert tw.verify(tw.QUICK, committed=quick_world)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"[tiny-world] {name}: identical to the committed build" for name in names]


def test_a_verification_in_parts_retrains_only_the_named_models_from_the_committed_ones(
    quick_world, tmp_path, monkeypatch, capsys
):
    """`verify(only=...)` (`--verify --only`), a verification split between sessions: teacher-es
    alone is retrained, from the committed teacher, and matches; nothing else is trained, and the
    folder is not a world (no quality.json). With the committed teacher changed by 1e-3 in one
    weight, the retrained teacher-es differs: it starts from the committed teacher, not a new one."""
    import shutil

    import distill.models.tiny_world as tw

    trained, train = [], tw.train_model
    monkeypatch.setattr(tw, "train_model", lambda *a, **k: trained.append(a[3]) or train(*a, **k))
    work = tmp_path / "part"
    assert tw.verify(tw.QUICK, committed=quick_world, work=work, only=["teacher-es"])
    assert trained == ["teacher-es"]
    assert "[tiny-world] teacher-es: identical to the committed build" in capsys.readouterr().out.splitlines()
    assert not (work / "quality.json").exists() and not (work / "teacher").exists()
    assert f"teacher: loaded from {quick_world} (not retrained" in (work / "build.log").read_text()

    changed = copy_with_one_weight_changed(quick_world, tmp_path / "changed", "teacher", 1e-3)
    assert not tw.verify(tw.QUICK, committed=changed, only=["teacher-es"])
    assert trained == ["teacher-es", "teacher-es"]
    out = capsys.readouterr().out  # both trained here: the cause is not the CPU; the figures follow
    assert "teacher-es: DIFFERS from the committed build; trained on the same kind of CPU (" in out
    assert "teacher-es's figures, committed / retrained" in out

    with pytest.raises(
        ValueError, match="--only must name some of the world's models, teacher, .*; got 'tutor'"
    ):
        tw.verify(tw.QUICK, committed=quick_world, only=["teacher-es", "tutor"])
    shutil.rmtree(changed / "teacher")  # what teacher-es starts from is not there
    with pytest.raises(ValueError, match="--only: teacher, which a model asked for starts from, is not in"):
        tw.verify(tw.QUICK, committed=changed, only=["teacher-es"])
    assert trained == ["teacher-es", "teacher-es"]

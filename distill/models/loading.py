"""Loading teacher, student and tokenizer from a hub id or a local directory, and checking that
they can be distilled into each other (same tokenizer; logits compared over the real vocabulary)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import torch

from distill.checks import check_choice
from distill.models import real, tiny_world_names

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str | None, field: str = "dtype") -> torch.dtype | None:
    if name is None or name == "auto":
        return None
    if name not in DTYPES:
        raise ValueError(f"{field} must be one of {['auto', *DTYPES]}, got {name!r}")
    return DTYPES[name]


def looks_local(path: str) -> bool:
    """A path rather than a hub id: absolute, relative with ./ or ~, or an existing directory."""
    return path.startswith(("/", ".", "~")) or os.path.isdir(path) or path.count("/") > 1


def check_model_path(path: str, field: str) -> str:
    """Fail fast, before any model is loaded: a local path must be a model directory; a hub id must
    be `org/name` (and, with HF_HUB_OFFLINE=1, already in the local cache). `tiny-world-vN:NAME` is
    `NAME` in version vN's folder ($DISTILL_CACHE/tiny-world-vN), `tiny-world:NAME` in the default
    version's (`tiny_world_names`); `real:NAME` is a pretrained model shipped in a wheel, converted
    into the cache on first use (`real`). Returns the resolved path."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"{field} must be a local model directory or a hub id like 'org/name', got {path!r}")
    path = real.resolve(path, field)
    hint = ""
    world = tiny_world_names.split_name(path)
    if world is not None:
        version, name = world
        flag = "" if path.startswith("tiny-world:") else f" --version {version}"
        legacy = tiny_world_names.cache_root() / tiny_world_names.LEGACY_FOLDER
        old_folder = (
            f"; {legacy} is a v2 build under the old folder name, not read: "
            f"`tiny-world:` is {version}, v2 is `tiny-world-v2:{name}`"
            if path.startswith("tiny-world:") and legacy.is_dir()
            else ""
        )
        hint = f" (run `distill tiny-world{flag}` first){old_folder}"
        folder = tiny_world_names.default_dir(version)
        installed = sorted(p.parent.name for p in folder.glob("*/config.json"))
        if installed and name not in installed:  # the world is there; the name is not one of its
            close = difflib.get_close_matches(name, installed, n=1)
            raise FileNotFoundError(
                f"{field}: tiny world {version} (in {folder}) has no model {name!r}"
                + (f" (did you mean {path[: -len(name)] + close[0]!r}?)" if close else "")
                + f"; its models: {installed}{old_folder}"
            )
        path = str(folder / name)
    if looks_local(path):
        local = Path(path).expanduser()
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"{field}: no model directory at {path!r} (config.json missing){hint}")
        check_weight_files(local, field)
        return str(local)
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(path, "config.json"), str):
            raise FileNotFoundError(
                f"{field}: hub model {path!r} is not in the local cache and HF_HUB_OFFLINE=1"
            )
    return path


def check_weight_files(directory: Path, field: str) -> None:
    """Every `*.safetensors` file of a local model must have a whole header that its size covers
    (read without loading a tensor), so a truncated or corrupt file is named before any load."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(file), "pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{field}: weight file {str(file)!r} is corrupt or truncated ({err})") from None


def load_tokenizer(path: str):
    """A tokenizer for decoder-only generation: left padding, and a pad token (EOS if it has none)."""
    from transformers import AutoTokenizer

    path = real.resolve(path, "tokenizer")
    tok = AutoTokenizer.from_pretrained(str(Path(path).expanduser()) if looks_local(path) else path)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def check_same_tokenizer(teacher_tok, student_tok, teacher: str, student: str) -> None:
    """Token-level divergences need one vocabulary: same token -> id map and special tokens."""
    if teacher_tok.get_vocab() != student_tok.get_vocab():
        t, s = teacher_tok.get_vocab(), student_tok.get_vocab()
        differ = sorted(set(t.items()) ^ set(s.items()), key=str)[:3]
        raise ValueError(
            f"teacher {teacher!r} and student {student!r} have different tokenizers "
            f"({len(t)} vs {len(s)} tokens; e.g. {differ}); token-level distillation needs a shared one"
        )
    for attr in ("eos_token_id", "bos_token_id"):
        if getattr(teacher_tok, attr) != getattr(student_tok, attr):
            raise ValueError(
                f"teacher {teacher!r} and student {student!r} disagree on {attr}: "
                f"{getattr(teacher_tok, attr)} vs {getattr(student_tok, attr)}"
            )


def attention_implementations() -> list[str]:
    """The attention implementations this transformers version knows (`attn_implementation`)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ["eager", *sorted(ALL_ATTENTION_FUNCTIONS.keys())]


def check_attn_implementation(name: str | None, field: str = "attn_implementation") -> str | None:
    """`name` if transformers knows it (None: the model's default, sdpa where supported)."""
    if name is not None:
        check_choice(field, name, attention_implementations())
    return name


def load_model(
    path: str,
    dtype: str | None = None,
    device: str | torch.device | None = None,
    trainable: bool = True,
    attn_implementation: str | None = None,
    gradient_checkpointing: bool = False,
):
    """An `AutoModelForCausalLM`; a frozen one (``trainable=False``) is in eval mode with no grads.

    `attn_implementation` goes to `from_pretrained` (None: transformers' default). With
    `gradient_checkpointing` (trainable models only) each decoder layer's activations are
    recomputed in backward instead of kept (non-reentrant `torch.utils.checkpoint`): less memory
    for about one more forward pass; the gradient is the same."""
    from transformers import AutoModelForCausalLM

    check_attn_implementation(attn_implementation)
    kwargs = {"dtype": resolve_dtype(dtype)} if resolve_dtype(dtype) is not None else {}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(
        str(Path(path).expanduser()) if looks_local(path) else path, **kwargs
    )
    if device is not None:
        model.to(device)
    # from_pretrained returns eval mode; a student must train (dropout etc.), a teacher never.
    model.train(trainable)
    model.requires_grad_(trainable)
    if gradient_checkpointing and trainable:
        if not model.supports_gradient_checkpointing:
            raise ValueError(
                f"model {path!r} ({type(model).__name__}) does not support gradient checkpointing"
            )
        # transformers >= 5.x names it activation checkpointing (the old name warns until v6).
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def vocab_size(tokenizer, *models) -> int:
    """The real vocabulary: the tokenizer's length, which padded embedding matrices may exceed."""
    size = len(tokenizer)
    for m in models:
        rows = m.get_output_embeddings().weight.shape[0]
        if rows < size:
            raise ValueError(
                f"model {m.name_or_path!r} has {rows} output rows, fewer than the tokenizer's {size} tokens"
            )
    return size

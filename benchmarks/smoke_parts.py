"""What benchmarks/gpu_smoke.py builds: model directories that hold only a config and a tokenizer
(`from_pretrained` builds them from config, randomly initialised), local stand-ins for the hub's
retention sets, and the paper configs' callbacks cut to one batch per measurement, each followed
by a `smoke_phases.PhaseMark`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from distill.config_bases import merged_config
from distill.memory import Architecture

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "configs" / "paper"
MARKER = "smoke_model.json"  # in a config-only model directory: build from config, randomly
CHAT = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


# --- models, tokenizer and data without the hub -----------------------------------------------------


def write_model(path: Path, arch: Architecture, dtype: str, tokenizer_size: int) -> str:
    """A directory with `arch`'s config (weights in `dtype`), a tokenizer of `tokenizer_size` tokens
    and the marker. The tokenizer splits words and punctuation as BPE pre-tokenizers do (prompts
    get about as many tokens as with the real tokenizers); words are <unk>, and filler tokens,
    sampled but never typed, fill the vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from distill.models.tiny import SPECIAL_TOKENS

    words = {w: i for i, w in enumerate(SPECIAL_TOKENS)}  # <pad> 0, <bos> 1, <eos> 2, <unk> 3
    words.update({f"<w{i}>": i for i in range(len(words), tokenizer_size)})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    special = dict(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, padding_side="left", model_max_length=arch.max_positions, **special
    )
    tokenizer.chat_template = CHAT
    tokenizer.save_pretrained(path)
    arch.config(bos_token_id=1, eos_token_id=2, pad_token_id=0, dtype=dtype).save_pretrained(path)
    (path / MARKER).write_text(json.dumps(dataclasses.asdict(arch)))
    return str(path)


def build_from_configs(device: torch.device) -> None:
    """From now on `from_pretrained` on a directory `write_model` made builds the model from its
    config with random weights, straight on `device` (one of more than 50 M parameters never on the
    CPU), and loads the tokenizer as written (transformers would otherwise pick the tokenizer class
    of the config's model type, e.g. Qwen2's byte-level BPE)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    models, tokenizers = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def smoke(path) -> Architecture | None:
        marker = Path(str(path)) / MARKER
        return Architecture(**json.loads(marker.read_text())) if marker.is_file() else None

    def model(path, *args, **kwargs):
        arch = smoke(path)
        if arch is None:
            return models(path, *args, **kwargs)
        if device.type == "cpu" and arch.params() > 5e7:
            raise RuntimeError(
                f"gpu_smoke: refusing to build {arch.name} ({arch.params():,} params) on the CPU"
            )
        config = AutoConfig.from_pretrained(path)
        options = {k: kwargs[k] for k in ("attn_implementation",) if kwargs.get(k)}
        with torch.device(device):
            built = AutoModelForCausalLM.from_config(
                config, dtype=kwargs.get("dtype") or config.dtype, **options
            )
        built.name_or_path = str(path)
        return built.eval()  # as from_pretrained returns it

    def tokenizer(path, *args, **kwargs):
        load = PreTrainedTokenizerFast.from_pretrained if smoke(path) else tokenizers
        return load(path, *args, **kwargs)

    AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained = model, tokenizer


def write_data(root: Path, sentences: int, rows: int = 96) -> dict[str, str]:
    """SciQ and MedReason rows (their hub fields) standing in for the retention sets; SciQ's
    support passages have `sentences` sentences (48: past Forgetting's 512-token cap)."""
    root.mkdir(parents=True, exist_ok=True)
    passage = " ".join(
        f"Sentence {j} explains how cells, forces and reactions work." for j in range(sentences)
    )
    options = "Answer Choices:\nA. Vitamin A\nB. Vitamin C\nC. Vitamin D\nD. Vitamin K"
    sets = {
        "sciq": [
            {
                "question": f"Question {i}: which gas do plants take in during photosynthesis?",
                **{f"distractor{k}": gas for k, gas in enumerate(("oxygen", "helium", "neon"), 1)},
                "correct_answer": "carbon dioxide",
                "support": f"Passage {i}. {passage}",
            }
            for i in range(rows)
        ],
        "medreason": [
            {
                "question": f"Case {i}: a patient has bleeding gums and fatigue. Which deficiency?",
                "options": options,
                "answer": "Vitamin C",
                "reasoning": "Scurvy follows a lack of vitamin C.",
                "dataset_name": "smoke",
                "id_in_dataset": i,
            }
            for i in range(rows)
        ],
    }
    paths = {name: str(root / f"{name}.jsonl") for name in sets}
    for name, items in sets.items():
        Path(paths[name]).write_text("".join(json.dumps(r) + "\n" for r in items))
    return paths


# --- the paper configs, cut short -------------------------------------------------------------------


def paper_config(name: str) -> dict:
    """A paper config with its `base:` files merged in."""
    return merged_config(PAPER / name)


def smoke_callbacks(
    config: dict, extra: list[dict], data: dict[str, str], new_tokens: int, steps: int
) -> list:
    """The config's callbacks and `extra`, each measuring at its usual occasions on one batch of
    the configured size and `new_tokens`, on the local data, with a `PhaseMark` before the first and
    after each."""
    held, never = "val=32&test=32", 10**6
    eval_rows = config["data"]["evaluation"]["batch_size"]
    tune = {
        "TaskEvaluation": lambda a: {"num_problems": max(1, eval_rows // a.get("num_samples", 8))},
        "Forgetting": lambda a: {
            "sets": [f"sciq:{data['sciq']}?{held}", f"medreason:{data['medreason']}?{held}"],
            "nll_texts": {"sciq_support": f"text:{data['sciq']}?field=support&rows={a['batch_size']}"},
            "num_examples": a["batch_size"],
            "every_n_steps": never,
            "max_new_tokens": new_tokens,
        },
        "StyleProbe": lambda a: {
            "num_prompts": a["batch_size"],
            "every_n_steps": never,
            "max_new_tokens": new_tokens,
        },
        "UpdateSparsity": lambda a: {"every_n_steps": steps},
        "GradientStats": lambda a: {"every_n_steps": 1},
    }
    out = [{"class_path": "smoke_phases.PhaseMark"}]
    for callback in config["trainer"]["callbacks"] + extra:
        name = callback["class_path"].rsplit(".", 1)[-1]
        init = dict(callback.get("init_args") or {})
        init |= tune[name](init) if name in tune else {}
        out.append({"class_path": callback["class_path"], "init_args": init})
        out.append({"class_path": "smoke_phases.PhaseMark", "init_args": {"after": name}})
    return out

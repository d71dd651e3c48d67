"""Building blocks of the CPU tiny world: a character tokenizer and small Llama-style configs.

The tokenizer is a standard Hugging Face fast tokenizer (WordLevel over single characters), so
`AutoTokenizer.from_pretrained` loads it offline like any hub tokenizer.
"""

from __future__ import annotations

import re

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
# Countdown's tags are single tokens (as in many hub vocabularies): the tiny models then spend no
# capacity or compute on spelling them. Decoding still yields the plain strings.
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")
# Printable ASCII plus newline: everything the tiny world's tasks write.
CHARS = tuple(chr(i) for i in range(32, 127)) + ("\n",)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: ids 0-3 are pad/bos/eos/unk, 4-7 Countdown's tags, then one id
    per character (104 in all).

    Encoding prepends `<bos>`; padding is on the left (decoder-only generation).
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + TAG_TOKENS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tags = "|".join(re.escape(t) for t in TAG_TOKENS)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(rf"{tags}|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=512,
    )


def llama_config(
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int | None = None,
    max_positions: int = 256,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    pad_token_id: int = 0,
) -> LlamaConfig:
    """A small Llama-style config. `vocab_size` may exceed the tokenizer's length (padded embeddings,
    as in real checkpoints)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        attention_dropout=0.0,
    )

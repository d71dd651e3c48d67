"""A Llama/Qwen2-style decoder's shapes and what its parts weigh: parameters, the weights bf16
autocast casts, KV cache per token, the activations a training forward saves, a prefill's working
set (`Architecture`); and the paper's four models as shapes. `distill.memory` composes these into a
run's memory by phase.
"""

from __future__ import annotations

from dataclasses import dataclass

BF16, FP32 = 2, 4  # bytes per element


@dataclass(frozen=True)
class Architecture:
    """A Llama/Qwen2-style decoder's shapes. `vocab` is the LM head's rows (the config's
    `vocab_size`, which may exceed the tokenizer's)."""

    name: str
    family: str  # "llama" or "qwen2" (q/k/v biases)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    max_positions: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def block_params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_dim
        bias = q + 2 * kv if self.family == "qwen2" else 0
        return h * q + 2 * h * kv + q * h + bias + 3 * h * self.intermediate + 2 * h

    def params(self) -> int:
        return (
            self.layers * self.block_params()
            + self.vocab * self.hidden * (1 if self.tied else 2)
            + self.hidden
        )

    def cast_params(self) -> int:
        """What bf16 autocast casts: every matmul's weight and bias, the LM head's too; not the
        embedding lookup (untied) or the norms. A training forward keeps all of these copies (autograd
        saves each linear's bf16 weight for backward); a no-grad forward under Lightning's autocast
        (`cache_enabled=False`) keeps none beyond the op that made it (`largest_cast`)."""
        embedding = 0 if self.tied else self.vocab * self.hidden
        return self.params() - embedding - (2 * self.layers + 1) * self.hidden

    def largest_cast(self) -> int:
        """Bytes of the largest single bf16 weight copy: the LM head's (vocab x hidden), alive while
        its matmul runs in a no-grad forward under an autocast without a weight cache."""
        return BF16 * self.hidden * max(self.vocab, self.intermediate, self.heads * self.head_dim)

    def kv_bytes_per_token(self, key_itemsize: int, value_itemsize: int) -> int:
        return self.layers * self.kv_dim * (key_itemsize + value_itemsize)

    def activation_bytes(self, rows: int, seq: int, keep: int) -> int:
        """Bytes saved for backward by a training forward over `rows` x `seq` tokens with logits for
        the last `keep` positions, under bf16 autocast with float32 weights. Per token and layer:
        the float32 residual and normalised input of both norms (4 x 4h) and their rsqrt; the bf16
        casts of the inputs of q, k, v, gate and up (5 x 2h, one cast per linear); q, the repeated
        keys and values and the attention output in bf16 (4 x 2 x heads x head_dim) and the
        float32 log-sum-exp; gate, silu(gate), up and their product (4 x 2I); the attention mask in
        bf16 (2 x seq). Per token: the final norm's input and output (2 x 4h), RoPE's cos and sin
        (2 x 4 x head_dim); per kept position the LM head's input cast (2h)."""
        h, q = self.hidden, self.heads * self.head_dim
        per_layer = 16 * h + 8 + 10 * h + 8 * q + 4 * self.heads + 8 * self.intermediate + 2 * seq
        per_token = self.layers * per_layer + 8 * h + 4 + 8 * self.head_dim
        return rows * seq * per_token + rows * keep * 2 * h

    def prefill_bytes(self, rows: int, seq: int) -> int:
        """The working set of a no-grad forward over a prompt, one layer at a time: the embedding
        output, the float32 residual before and after the layer and the norm's output (4 x 4h),
        silu(gate), up and their product in bf16 (3 x 2I), RoPE's cos and sin (2 x 4 x head_dim)
        and the boolean attention mask (seq)."""
        return rows * seq * (16 * self.hidden + 6 * self.intermediate + 8 * self.head_dim + seq)

    def config(self, **overrides):
        """A transformers config of these shapes (random-initialised models, no download)."""
        from transformers import LlamaConfig, Qwen2Config

        cls = Qwen2Config if self.family == "qwen2" else LlamaConfig
        return cls(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=self.max_positions,
            tie_word_embeddings=self.tied,
            **overrides,
        )

    @classmethod
    def from_config(cls, config, name: str = "") -> Architecture:
        return cls(
            name=name or getattr(config, "name_or_path", "") or config.model_type,
            family="qwen2" if config.model_type == "qwen2" else "llama",
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            intermediate=config.intermediate_size,
            vocab=config.vocab_size,
            tied=bool(config.tie_word_embeddings),
            max_positions=config.max_position_embeddings,
        )


# The paper's models (their hub configs' shapes).
LLAMA_8B = Architecture("Llama-3.1-8B", "llama", 32, 4096, 32, 8, 14336, 128256, False, 131072)
LLAMA_1B = Architecture("Llama-3.2-1B", "llama", 16, 2048, 32, 8, 8192, 128256, True, 131072)
QWEN_7B = Architecture("Qwen2.5-7B", "qwen2", 28, 3584, 28, 4, 18944, 152064, False, 32768)
QWEN_1_5B = Architecture("Qwen2.5-1.5B", "qwen2", 28, 1536, 12, 2, 8960, 151936, True, 32768)
TOKENIZER_SIZE = {"llama": 128256, "qwen2": 151665}  # len(tokenizer) of each family
HUB = {  # the paper configs' model ids
    "meta-llama/Llama-3.1-8B-Instruct": LLAMA_8B,
    "meta-llama/Llama-3.2-1B-Instruct": LLAMA_1B,
    "Qwen/Qwen2.5-7B-Instruct": QWEN_7B,
    "Qwen/Qwen2.5-1.5B-Instruct": QWEN_1_5B,
}

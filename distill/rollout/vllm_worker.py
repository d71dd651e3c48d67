"""Loaded inside vLLM's engine process (`worker_extension_cls`): the student's new weights in place.

Kept apart from `vllm_engine` on purpose: the engine process imports this module by name, and it
needs only torch and safetensors, never distill's training stack.
"""

from __future__ import annotations


class WeightSync:
    """Mixed into vLLM's worker class; `LLM.collective_rpc("load_safetensors", args=(path,))` calls
    it on every worker of the engine."""

    def load_safetensors(self, path: str) -> int:
        """Reload the model's weights from a safetensors file of checkpoint-format (Hugging Face)
        names; returns how many tensors it held."""
        from safetensors.torch import load_file

        weights = load_file(path)
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        repack_tied_head(self.model_runner.get_model())
        return len(weights)


def repack_tied_head(model) -> None:
    """With tied embeddings the LM head is the embedding matrix, and a reload processes that
    parameter once, as the embedding: a backend that prepacks the head's weight for its matmul (the
    CPU backend does) keeps the old packed copy, and the logits stay those of the old weights
    (0.23 apart on SmolLM2 after one sync). Processing the head again repacks it."""
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tied and method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)

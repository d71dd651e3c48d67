"""distill: controlled studies of LLM knowledge distillation.

Three knobs varied independently: the rollout policy (teacher / student / mixture), the token-level
divergence (forward KL, reverse KL and their family) and the optimiser. See README.md.
"""

__version__ = "0.1.0"

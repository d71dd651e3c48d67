# docs/examples/hellinger.py
"""A divergence of your own (docs/extending.md): the squared Hellinger distance, written once as its
per-token formula; values and gradients come from autograd on each chunk."""

from distill.losses import TokenDivergence


class SquaredHellinger(TokenDivergence):
    """1 - sum_v sqrt(p_S(v) p_T(v)): symmetric, bounded in [0, 1]."""

    name = "squared_hellinger"

    def formula(self):
        # s, t: [n, V] rows of student and teacher log-probabilities; returns [n].
        return lambda s, t: 1 - (0.5 * (s + t)).exp().sum(-1)

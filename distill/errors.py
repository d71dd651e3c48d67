"""Errors that cross layers: a run whose numbers stopped being numbers; a setting refused in one line."""

from __future__ import annotations


class Diverged(RuntimeError):
    """Training produced non-finite values it cannot recover from: too many optimiser steps in a
    row with a non-finite loss or gradient norm, or a model whose next-token probabilities are no
    longer finite. `distill fit` ends such a run with `status: diverged` and this message."""


class ConfigError(ValueError):
    """A setting refused before any compute. `distill fit|validate|test` prints it as one line,
    `distill <command>: error: <message>`, naming the field, the value and what is allowed, and
    exits 2."""

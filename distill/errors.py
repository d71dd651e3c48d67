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


class Interrupted(RuntimeError):
    """A fit stopped on a signal (SIGTERM: preemption, a time limit, `kill`), every rank at the
    same step, after writing the checkpoint `resume_from` names (None: none could be written).
    `distill fit` ends such a run with an `interrupted` status record and exit status 128 + the
    signal's number."""

    def __init__(self, signal_name: str, step: int, resume_from: dict | None):
        super().__init__(f"{signal_name} at step {step}")
        self.signal_name, self.step, self.resume_from = signal_name, step, resume_from

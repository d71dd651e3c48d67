"""Running sweeps: what a sweep declares (spec, claims file), how each run is prepared, launched
and recorded in its run directory, and how a sweep directory or its archive is read back.

Imports nothing from `distill.experiments.stats` or `distill.experiments.report`.
"""

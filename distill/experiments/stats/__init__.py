"""Statistics over a sweep's records: intervals for paired differences, factor importance, the
verdict rule of the declared claims, and the power planning of a study's seeds.

Imports `distill.experiments.run` (records, specs, claims) and nothing from `distill.experiments.report`.
"""

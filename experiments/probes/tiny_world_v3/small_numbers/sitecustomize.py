"""A probe world with small numbers (LOG, 2026-12-03): on PYTHONPATH, every process
(the build's training, `distill fit`, `distill sweep`) reads Countdown-3, Countdown-4 and the long
chain over numbers 1..20 (targets 1..99), so that a step's arithmetic is a small table a 2 x 128
student can learn and what the teacher knows better is the search. Nothing outside the probe uses it."""

from distill.tasks import countdown, countdown_chain

HIGH = 20
countdown.DIFFICULTIES["countdown3"] = countdown.Difficulty(3, 1, HIGH, 1, 99)
countdown.DIFFICULTIES["countdown4"] = countdown.Difficulty(4, 1, HIGH, 1, 99)
countdown_chain.SECOND_HIGH = HIGH  # the second link's new numbers; its target stays 1..TARGET_HIGH (99)

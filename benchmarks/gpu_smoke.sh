#!/usr/bin/env bash
# bash benchmarks/gpu_smoke.sh [ARGS]  (make gpu-smoke): benchmarks/gpu_smoke.py with PYTHON (default
# python3), offline and without the rollout cache; ARGS and what it reports: that script's header
# (--help). On one GPU, with nothing downloaded: random-initialised models of the paper's shapes run
# validation, every callback, GRPO, DDP and FSDP2, and report peak memory per phase, decoding speed
# against the bandwidth floor and TRL GKD's step time; --toy runs tiny shapes on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset DISTILL_ROLLOUT_CACHE  # timings and peaks of fresh rollouts, never of cached teacher rows
exec "${PYTHON:-python3}" benchmarks/gpu_smoke.py "$@"

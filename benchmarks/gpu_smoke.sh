#!/usr/bin/env bash
# bash benchmarks/gpu_smoke.sh [--steps N] [--pairs llama,qwen] [--out DIR] [--timeout S] [--dry-run]
# (make gpu-smoke). A few optimiser steps of each paper pair (configs/paper/<pair>_base.yaml:
# Countdown-3, bf16-mixed with float32 master weights, chat template; here at mix 0.5, so both the
# teacher and the student write rollouts) on one GPU, with the hub models already in the local
# cache (HF_HUB_OFFLINE=1: nothing is downloaded). Prints per pair: seconds per optimiser step,
# rollout tokens/s (generated tokens / rollout time), tokens/s (every token a model read / fit
# time) and peak GPU memory (allocated and reserved). Validation, testing, checkpoints and the
# measurement callbacks other than CostMeter are off. Each pair is stopped after --timeout seconds
# (default 210), so two pairs stay under 8 minutes. Exit 2, naming what is missing, without a CUDA
# GPU or when a model is not cached (fetch it first: `huggingface-cli download <id>`); exit 1 when
# a pair fails or times out (its log: <out>/<pair>.log). --dry-run checks the cache and prints
# each pair's command without running anything. PYTHON (default: python3) runs distill.
set -euo pipefail

STEPS=5
PAIRS=llama,qwen
OUT=""
TIMEOUT=210
DRY_RUN=0
PYTHON=${PYTHON:-python3}

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_smoke: $1" >&2; exit "${2:-2}"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--steps must be an integer >= 1, got '${2:-}'"; STEPS=$2; shift 2 ;;
    --pairs) [[ -n "${2:-}" ]] || die "--pairs needs a value: llama, qwen or llama,qwen"; PAIRS=$2; shift 2 ;;
    --out) [[ -n "${2:-}" ]] || die "--out needs a directory"; OUT=$2; shift 2 ;;
    --timeout) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--timeout must be seconds >= 1, got '${2:-}'"; TIMEOUT=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (allowed: --steps N, --pairs LIST, --out DIR, --timeout S, --dry-run, --help)" ;;
  esac
done

# The models of configs/paper/{llama,qwen}_base.yaml (tests/test_gpu_smoke.py checks they agree).
declare -A STUDENT=([llama]=meta-llama/Llama-3.2-1B-Instruct [qwen]=Qwen/Qwen2.5-1.5B-Instruct)
declare -A TEACHER=([llama]=meta-llama/Llama-3.1-8B-Instruct [qwen]=Qwen/Qwen2.5-7B-Instruct)
IFS=, read -r -a PAIR_LIST <<<"$PAIRS"
for pair in "${PAIR_LIST[@]}"; do
  [[ -n "${STUDENT[$pair]:-}" ]] || die "--pairs must name pairs from llama, qwen; got '$pair'"
done

cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset DISTILL_ROLLOUT_CACHE  # timings of fresh rollouts, never of cached teacher rollouts

models=()
for pair in "${PAIR_LIST[@]}"; do models+=("${STUDENT[$pair]}" "${TEACHER[$pair]}"); done
"$PYTHON" - "${models[@]}" <<'PY' || exit 2
import sys

from huggingface_hub import try_to_load_from_cache

missing = [m for m in sys.argv[1:] if not isinstance(try_to_load_from_cache(m, "config.json"), str)]
if missing:
    fetch = "; ".join(f"huggingface-cli download {m}" for m in missing)
    sys.exit(f"gpu_smoke: not in the hub cache (HF_HOME): {', '.join(missing)}; fetch first: {fetch}")
PY

OUT=${OUT:-$(mktemp -d -t gpu_smoke.XXXXXX)}
fit_args() {  # the fit's arguments for one pair, into ARGS
  ARGS=(fit --config "configs/paper/$1_base.yaml" --run_dir "$OUT/$1" --overwrite true
    --trainer.max_steps "$STEPS" --trainer.limit_val_batches 0 --trainer.enable_checkpointing false
    --checkpoint_every_n_steps 0 --test_after_fit false --drop_checkpoints false
    --trainer.callbacks '[{"class_path": "distill.callbacks.CostMeter"}]'
    --data.mix 0.5 --data.batch_size 8 --data.train_size 64 --data.max_new_tokens 256)
}
if [[ $DRY_RUN == 1 ]]; then
  for pair in "${PAIR_LIST[@]}"; do
    fit_args "$pair"
    printf '%s: %q -m distill.cli' "$pair" "$PYTHON"; printf ' %q' "${ARGS[@]}"; echo
  done
  exit 0
fi

"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || die "no CUDA GPU visible (torch.cuda.is_available() is False); run this on a GPU machine"

mkdir -p "$OUT"
failed=0
for pair in "${PAIR_LIST[@]}"; do
  echo "gpu_smoke: $pair (${STUDENT[$pair]} <- ${TEACHER[$pair]}), $STEPS steps; log: $OUT/$pair.log" >&2
  fit_args "$pair"
  set +e
  timeout "$TIMEOUT" "$PYTHON" - "$STEPS" "$OUT/$pair.json" "${ARGS[@]}" >"$OUT/$pair.log" 2>&1 <<'PY'
import json
import sys

import torch

from distill.lightning_cli import run_lightning_cli

steps, out, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
metrics = run_lightning_cli(argv)
wall = metrics["cost/wall_s"]
generated = metrics["cost/teacher_generated_tokens"] + metrics["cost/student_generated_tokens"]
read = metrics["cost/teacher_forward_tokens"] + metrics["cost/student_forward_tokens"]
rollout_s = metrics.get("cost/time/rollout") or float("nan")
result = {
    "steps": steps,
    "s_per_step": wall / steps,
    "rollout_tokens_per_s": generated / rollout_s,
    "tokens_per_s": read / wall,
    "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
    "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
}
with open(out, "w") as f:
    json.dump(result, f)
PY
  code=$?
  set -e
  if [[ $code == 124 ]]; then
    echo "gpu_smoke: $pair did not finish within ${TIMEOUT}s; log: $OUT/$pair.log" >&2; failed=1
  elif [[ $code != 0 ]]; then
    echo "gpu_smoke: $pair failed (exit $code); last lines of $OUT/$pair.log:" >&2
    tail -n 15 "$OUT/$pair.log" >&2; failed=1
  fi
done

"$PYTHON" - "$OUT" "${PAIR_LIST[@]}" <<'PY'
import json
import sys
from pathlib import Path

out, pairs = Path(sys.argv[1]), sys.argv[2:]
print(f"{'pair':<6} {'steps':>5} {'s/step':>8} {'rollout tok/s':>14} {'tokens/s':>10} {'peak GiB alloc/reserved':>24}")
for pair in pairs:
    path = out / f"{pair}.json"
    if not path.is_file():
        print(f"{pair:<6} {'failed':>5}")
        continue
    r = json.loads(path.read_text())
    peak = f"{r['peak_allocated_gib']:.1f} / {r['peak_reserved_gib']:.1f}"
    print(
        f"{pair:<6} {r['steps']:>5} {r['s_per_step']:>8.2f} {r['rollout_tokens_per_s']:>14.0f} "
        f"{r['tokens_per_s']:>10.0f} {peak:>24}"
    )
PY
exit "$failed"

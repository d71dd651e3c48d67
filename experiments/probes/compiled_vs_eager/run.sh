#!/bin/bash
# compiled vs eager on the tiny world v2 base config, 300 steps
cd /work/v3build; export PYTHONPATH=/work/v3build OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
run() { # name seed compile
  /usr/bin/time -f "%e s wall" /work/main/.venv/bin/python -m distill.cli fit --config configs/tiny/base.yaml \
    --trainer.max_steps 300 --seed_everything $2 --model.init_args.compile_decoding $3 \
    --model.init_args.compile_forwards $3 --run_dir /work/cmp/$1 > /work/cmp/$1.log 2>&1
}
for s in 0 1; do
  run eager_s$s $s false & run compiled_s$s $s true & wait
done

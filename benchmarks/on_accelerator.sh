#!/usr/bin/env bash
# The accelerator session in one call (the device machine starts bare, its image has jax[cuda], torch and
# transformers): install the carried wheels this project needs beyond the image (.whl/: gguf, ml_collections, and
# faiss-cpu where a run searches; .whl/pinned/: the project's flax/optax/orbax, used only where the image's fail to
# import),
# then each command given (default: the bf16 numerics check and the accelerator benchmark), logged under $OUT.
# Usage (device tool): bash benchmarks/on_accelerator.sh ["COMMAND" ...], carrying .whl
set -u
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
if ! python3 -c "import flax.linen, optax, orbax.checkpoint, replug_jax.models.causal_lm" 2>"$OUT/import_error.txt"; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/pinned .whl/pinned/*.whl
  export PYTHONPATH=/tmp/pinned:$PYTHONPATH
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  python3 -c "
import importlib, jax
def version(name):  # faiss is carried only for the runs that search
    try: return importlib.import_module(name).__version__
    except ImportError: return 'not installed'
print({n: version(n) for n in ('jax', 'flax', 'optax', 'orbax.checkpoint', 'torch', 'transformers', 'faiss')}, jax.devices())"
} 2>&1 | tee "$OUT/versions.txt"
# each argument is one command to run after the setup (default: the numerics check, then the benchmark)
[ $# -gt 0 ] || set -- "python3 benchmarks/check_accelerator_numerics.py --out $OUT/results.jsonl" \
                       "python3 benchmarks/bench_accelerator.py --out $OUT/results.jsonl"
n=0
for command in "$@"; do
  n=$((n + 1)); echo "## $command" | tee "$OUT/step$n.log"
  bash -c "$command" 2>&1 | grep -v "Writing model" | tee -a "$OUT/step$n.log"
done

#!/usr/bin/env bash
# The GPU check of dapq (issue 20): equivalence on the device, then the 8B-shape speed sweep with
# the kvpress peers, then the report. One GPU, at most 8 minutes; everything lands in OUT.
#
#   scripts/gpu-wheels.sh                      # here, with the registry: the wheels (.whl/, ~17 MiB)
#   bash scripts/gpu-check.sh [OUT]            # there (carry .whl): OUT defaults to docs/results/speed-gpu
#   TOY=1 DEVICE=cpu bash scripts/gpu-check.sh /tmp/gpu-toy   # the same script at toy sizes on a CPU
#
# The GPU machine has Python 3.12, torch and transformers (../shared/notes/gpu.md); .whl/dapq holds
# what dapq needs beyond them and .whl/kvpress the environment of the kvpress child (transformers
# 5.2, kvpress 0.5.5), which runs as $DAPQ_KVPRESS_PYTHON. Nothing is downloaded there.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/results/speed-gpu}
DEVICE=${DEVICE:-cuda}
TOY=${TOY:-0}
PY=${PY:-python3}
# The carried wheels are built for the GPU machine's Python (3.12); a toy run uses the caller's env.
WHEELS=${WHEELS:-$([ "$TOY" = 1 ] && echo 0 || echo 1)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "$WHEELS" = 1 ] && [ -d .whl/dapq ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/dapq-site .whl/dapq/*.whl
    export PYTHONPATH="$PWD/src:/tmp/dapq-site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ "$WHEELS" = 1 ] && [ -d .whl/kvpress ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/kvpress-site .whl/kvpress/*.whl
    cat > /tmp/kvpress-python <<WRAP
#!/usr/bin/env bash
export PYTHONPATH=/tmp/kvpress-site:$PWD/src:/tmp/dapq-site
exec $PY "\$@"
WRAP
    chmod +x /tmp/kvpress-python
    export DAPQ_KVPRESS_PYTHON=/tmp/kvpress-python
fi
[ "${SETUP_ONLY:-0}" = 1 ] && exit 0  # scripts/gpu-large-sets.sh reuses the set-up above
dapq() { "$PY" -m dapq.cli "$@"; }

{ "$PY" -c 'import torch, transformers, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
  "transformers", transformers.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))'
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; fi
} | tee "$OUT/machine.txt"

# 1. Equivalence on the device: kept sets and tokens against the CPU (fp32 exact, bf16 overlap),
#    every decode mode (static, graph: a CUDA graph there, eager) giving the same tokens.
DAPQ_TEST_DEVICE=$DEVICE "$PY" -m pytest -q -p no:cacheprovider tests/test_device.py 2>&1 | tee "$OUT/equivalence.txt"

# 2. Speed, the 8B shape at its real context (random weights, bf16, sdpa), budget 1024.
if [ "$TOY" = 1 ]; then
    shape=(--model "${TOY_MODEL:-}" ) ; [ -z "${TOY_MODEL:-}" ] && shape=()
    common=(--budget 32 --decode-tokens 4 --repeats 1 --warmup 1 --device "$DEVICE")
    short=(--lengths 256,512) long=(--lengths 1024) ctx=(--context 512) batches=(--batches 1,2,4)
else
    shape=(--random-weights llama-3.1-8b)
    common=(--budget 1024 --decode-tokens 32 --repeats 2 --warmup 1 --device "$DEVICE")
    short=(--lengths 8000,32000) long=(--lengths 65000,128000) ctx=(--context 32000) batches=(--batches 1,8,32,128,512)
fi
all="full,dapq,snapkv,pyramidkv,h2o,streamingllm,lacache,deferkv"
peers="kvpress:SnapKVPress,kvpress:ExpectedAttentionPress,kvpress:StreamingLLMPress"
# TTFT of every method at 8k and 32k; at 64k and 128k the methods whose compression does not grow
# with the square of the context (H2O scores every query) to stay inside the time box.
dapq bench speed "${shape[@]}" "${common[@]}" --methods "$all" "${short[@]}" --parts ttft --out "$OUT"
dapq bench speed "${shape[@]}" "${common[@]}" --methods full,dapq,snapkv,streamingllm "${long[@]}" --parts ttft \
    --out "$OUT"
# Decode at 32k for every batch (each method up to the batch it fits), in the default mode and as
# CUDA graphs; e2e; the kvpress peers.
for mode in static graph; do
    dapq bench speed "${shape[@]}" "${common[@]}" --methods "$all" "${ctx[@]}" "${batches[@]}" --parts decode \
        --decode "$mode" --out "$OUT"
done
dapq bench speed "${shape[@]}" "${common[@]}" --methods full,dapq,snapkv,deferkv "${ctx[@]}" --parts e2e,peer \
    --peers "$peers" --out "$OUT" | tail -n +1 > /dev/null
# 3. The report (its tables give each figure's share of the memory-bandwidth bound on CUDA).
dapq report "$OUT" --no-plots > "$OUT/report.md"
tail -n 60 "$OUT/report.md"

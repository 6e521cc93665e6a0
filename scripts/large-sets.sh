#!/usr/bin/env bash
# Issue 22's larger sets on this CPU: RULER-4k in context mode at 25% of the context kept, dapq's
# methods, grown in rounds of two prompts per task so that a stop at any time leaves every task
# with the same count (each round resumes the last; the store keeps what finished).
#
#   scripts/large-sets.sh [OUT] [UP_TO]      # OUT defaults to docs/results/large-sets/ruler-4k-context
#
# The directory starts from docs/results/context-mode/ruler-4k's context-mode 25% records (2 per
# task, the kvpress rows included), which the same keys resume. rounds.txt logs each round's
# prompts per task and seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/results/large-sets/ruler-4k-context}
up_to=${2:-50}
dapq=${DAPQ:-.venv/bin/dapq}
# tova (native, the same keep sets as kvpress's TOVAPress, which leads this mode at 2 prompts a
# task) joined after the others had reached 50 a task; it costs a dapq row's time, not a kvpress one's.
ours="full,dapq,dapq(preset='paper'),deferkv,snapkv,streamingllm,tova"
for n in $(seq 4 2 "$up_to"); do
    start=$(date +%s)
    "$dapq" bench ruler --lengths 4000 --seed 1 --samples "$n" --keep-fractions 0.25 --compress context \
        --methods "$ours" --out "$out" > /dev/null
    echo "$n per task: $(( $(date +%s) - start )) s ($(date -u +%H:%M))" >> "$out/rounds.txt"
done

#!/usr/bin/env bash
# Issue 22's larger sets on this CPU: RULER-4k at 25% of the context kept, dapq's methods, grown in
# rounds so that a stop at any time leaves every task with the same count (each round resumes the
# last; the store keeps what finished).
#
#   scripts/large-sets.sh [OUT] [UP_TO]              # context mode, OUT = docs/results/large-sets/ruler-4k-context
#   COMPRESS=prompt STEP=10 scripts/large-sets.sh     # prompt mode, OUT = docs/results/large-sets/ruler-4k-prompt
#
# The context-mode directory starts from docs/results/context-mode/ruler-4k's context-mode 25%
# records (2 per task, the kvpress rows included), which the same keys resume. rounds.txt logs each
# round's prompts per task and seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
compress=${COMPRESS:-context}
case $compress in context|prompt) ;; *) echo "COMPRESS must be context or prompt" >&2; exit 2 ;; esac
out=${1:-docs/results/large-sets/ruler-4k-$compress}
up_to=${2:-50}
step=${STEP:-2}
dapq=${DAPQ:-.venv/bin/dapq}
# tova (native, the same keep sets as kvpress's TOVAPress, which leads context mode at 2 prompts a
# task) joined after the others had reached 50 a task; it costs a dapq row's time, not a kvpress one's.
ours="full,dapq,dapq(preset='paper'),deferkv,snapkv,streamingllm,tova"
if [ "$compress" = prompt ]; then
    # In prompt mode the question is in the prompt, so this set asks whether dapq(preset='context'),
    # chosen with the question unseen (scripts/dapq-variants.sh), would also serve as the default.
    # Its row is named by its parameters, as in the context-mode set.
    ours+=",dapq(position_offset=64,group_reduce='layer')"
fi
mkdir -p "$out"
for n in $(seq "$step" "$step" "$up_to"); do
    start=$(date +%s)
    "$dapq" bench ruler --lengths 4000 --seed 1 --samples "$n" --keep-fractions 0.25 --compress "$compress" \
        --methods "$ours" --out "$out" > /dev/null
    echo "$n per task: $(( $(date +%s) - start )) s ($(date -u +%H:%M))" >> "$out/rounds.txt"
done

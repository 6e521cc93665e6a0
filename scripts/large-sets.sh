#!/usr/bin/env bash
# Issue 22's larger sets on this CPU: RULER-4k and NIAH-4k, dapq's methods, grown in rounds so that
# a stop at any time leaves every task (or depth) with the same count (each round resumes the last;
# the store keeps what finished).
#
#   scripts/large-sets.sh [OUT] [UP_TO]              # context mode, 25% kept: OUT = docs/results/large-sets/ruler-4k-context
#   COMPRESS=prompt STEP=5 scripts/large-sets.sh     # prompt mode: OUT = docs/results/large-sets/ruler-4k-prompt
#   KEEP=0.5 STEP=5 scripts/large-sets.sh            # 50% kept: OUT = docs/results/large-sets/ruler-4k-context-50
#   SET=niah STEP=4 scripts/large-sets.sh            # NIAH-4k, 5 depths, budget 128: OUT = .../niah-4k-context
#   ROWS=kvpress:ExpectedAttentionPress scripts/large-sets.sh   # only these rows (a kvpress press, a new row)
#
# The context-mode directories start from docs/results/context-mode/ruler-4k's context-mode records
# at their kept fraction, with FullKV's (2 per task, the kvpress rows included; copied in once, by
# hand), which the same keys resume; niah-4k-context likewise starts from context-mode/niah-4k's
# budget-128 records. rounds.txt logs each round's prompts per task (or depth) and seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
compress=${COMPRESS:-context}
case $compress in context|prompt) ;; *) echo "COMPRESS must be context or prompt" >&2; exit 2 ;; esac
taskset=${SET:-ruler}
case $taskset in ruler|niah) ;; *) echo "SET must be ruler or niah" >&2; exit 2 ;; esac
keep=${KEEP:-0.25}
case $keep in 0.25) suffix= ;; 0.5) suffix=-50 ;; *) echo "KEEP must be 0.25 or 0.5" >&2; exit 2 ;; esac
[ "$taskset" = niah ] && suffix=
out=${1:-docs/results/large-sets/$taskset-4k-$compress$suffix}
up_to=${2:-50}
step=${STEP:-2}
dapq=${DAPQ:-.venv/bin/dapq}
# The rows, and why each joined when it did: scripts/large-sets-rows.sh (shared with the GPU script).
. scripts/large-sets-rows.sh
# ROWS grows some rows alone (a kvpress press, whose own prefill a round of every row need not wait
# for); rounds.txt then names them.
ours=${ROWS:-$large_set_rows}
# NIAH: the held-out haystack, five depths, as docs/results/context-mode/niah-4k and
# scripts/gpu-large-sets.sh run it, at one budget (128 tokens, 3.2% of the context: three budgets
# would triple a round).
if [ "$taskset" = niah ]; then
    args=(niah --lengths 4000 --seed 1 --haystack held_out --depths 0,0.25,0.5,0.75,1 --budgets 128)
else
    args=(ruler --lengths 4000 --seed 1 --keep-fractions "$keep")
fi
# kvpress's SnapKVPress at its own defaults (a 64-token window, mean over it, average pooling with
# kernel 5) keeps the same tokens as this native row (tests/test_kvpress_reference.py), so in context
# mode the native row stands in for it on every prompt at a dapq row's cost; the press itself costs
# its own prefill (scripts/gpu-large-sets.sh runs it). In prompt mode it stands in for nothing: the
# peer compresses the prompt less its last token (the question kvpress's pipeline needs), so the
# press's window ends one token earlier than the native row's.
[ "$compress" = context ] && [ -z "${ROWS:-}" ] && ours="$ours,snapkv(window=64,kernel=5,pooling='avg',query_reduce='mean')"
mkdir -p "$out"
for n in $(seq "$step" "$step" "$up_to"); do
    start=$(date +%s)
    "$dapq" bench "${args[@]}" --samples "$n" --compress "$compress" --methods "$ours" --out "$out" > /dev/null
    echo "${ROWS:+$ROWS, }$n per task: $(( $(date +%s) - start )) s ($(date -u +%H:%M))" >> "$out/rounds.txt"
done

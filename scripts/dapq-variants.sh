#!/usr/bin/env bash
# Issue 22, item 3: DapQ variants for context mode (the question unseen at compression time).
#
#   scripts/dapq-variants.sh tune  [OUT]   # tuning set: RULER-4k seed 2, 10 prompts a task, 25% kept
#   scripts/dapq-variants.sh check [OUT]   # the chosen variants on the large set (seed 1, 50 a task)
#
# The tuning set shares no seed with the large set of docs/results/large-sets/ruler-4k-context, so
# a variant chosen here is judged there on prompts it was not chosen on. Both stages resume.
set -euo pipefail
cd "$(dirname "$0")/.."
dapq=${DAPQ:-.venv/bin/dapq}
stage=${1:?tune or check}
# Variants the paper's idea suggests when the question is unknown: a recent window next to the
# pseudo queries (the question will follow the context's end), pseudo keys inside the softmax, the
# pseudo positions pushed past the end (where a question after a gap would sit), and PyramidKV's
# per-layer budgets. StreamingLLM is the reference that ties the default today.
variants="dapq,dapq(keep_recent=64),dapq(keep_recent=256),dapq(normalize='all'),dapq(position_offset=64),dapq(layer_budget='pyramid'),streamingllm"
# Second round, after position_offset=64 won the first: what TOVA, the leader in this mode, does
# differently (one ranking for all heads of a layer; no pooling), on top of that winner.
variants+=",tova,dapq(position_offset=64,group_reduce='layer'),dapq(position_offset=64,kernel=1)"
# Third round: head-wise budgets (Ada-KV's split of each layer's budget among its KV heads), on the
# default and on the first round's winner. Not on the layer-wide ranking: it ranks every head alike.
variants+=",dapq(head_budget='adaptive'),dapq(position_offset=64,head_budget='adaptive')"
case $stage in
    tune)
        out=${2:-docs/results/large-sets/variants-tuning}
        "$dapq" bench ruler --lengths 4000 --seed 2 --samples 10 --keep-fractions 0.25 --compress context \
            --methods "$variants" --out "$out" > /dev/null ;;
    check)
        out=${2:-docs/results/large-sets/ruler-4k-context}
        chosen=${CHOSEN:?set CHOSEN to the variants picked on the tuning set}
        for n in $(seq 10 10 50); do
            start=$(date +%s)
            "$dapq" bench ruler --lengths 4000 --seed 1 --samples "$n" --keep-fractions 0.25 --compress context \
                --methods "$chosen" --out "$out" > /dev/null
            echo "$chosen, $n per task: $(( $(date +%s) - start )) s ($(date -u +%H:%M))" >> "$out/rounds.txt"
        done ;;
    *) echo "usage: $0 tune|check [OUT]" >&2; exit 2 ;;
esac

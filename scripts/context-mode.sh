#!/usr/bin/env bash
# Context-only compression on the embedded model (issue 15): DapQ, its variants and baselines next to
# kvpress's presses, on the same samples, in one results store per task set.
#
#   scripts/context-mode.sh [OUT]      (default docs/results/context-mode; resumable: re-run to finish)
#
# - NIAH-4k, held-out haystack, 5 depths x 4 samples, budgets 64/128/256;
# - RULER-4k, 11 tasks x 2 samples, 25% and 50% of the context kept (kvpress's RULER-4k setting,
#   compression ratios 0.75 and 0.5);
# each in context mode (the question is not seen during compression) with kvpress's SnapKV,
# ExpectedAttention, TOVA and KVzip presses (their own defaults), and dapq's rows again in prompt
# mode. kvpress runs in a child process ($DAPQ_KVPRESS_PYTHON, or this interpreter if it has kvpress).
set -euo pipefail
out=${1:-docs/results/context-mode}
dapq=${DAPQ:-dapq}
ours="full,dapq,dapq(preset='paper'),deferkv,snapkv,streamingllm"
peers="kvpress:SnapKVPress,kvpress:ExpectedAttentionPress,kvpress:TOVAPress,kvpress:KVzipPress"

niah=(niah --lengths 4000 --haystack held_out --depths 0,0.25,0.5,0.75,1 --samples 4 --seed 1
      --budgets 64,128,256 --out "$out/niah-4k")
$dapq bench "${niah[@]}" --compress context --methods "$ours,$peers"
$dapq bench "${niah[@]}" --compress prompt --methods "$ours"

ruler=(ruler --lengths 4000 --samples 2 --seed 1 --ratios 0.25,0.5 --out "$out/ruler-4k")
$dapq bench "${ruler[@]}" --compress context --methods "$ours,$peers"
$dapq bench "${ruler[@]}" --compress prompt --methods "$ours"

$dapq report "$out/niah-4k" > /dev/null
$dapq report "$out/ruler-4k" > /dev/null

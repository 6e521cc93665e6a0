#!/usr/bin/env bash
# Context-only compression on the embedded model (issue 15): DapQ, its variants and baselines next to
# kvpress's presses, on the same samples, in one results store per task set.
#
#   scripts/context-mode.sh [OUT]      (default docs/results/context-mode; resumable: re-run to finish)
#
# - NIAH-4k, held-out haystack, 5 depths, budgets 64/128/256;
# - RULER-4k, 11 tasks, 25% and 50% of the context kept (kvpress's RULER-4k setting, compression
#   ratios 0.75 and 0.5);
# in context mode (the question is not seen during compression), with kvpress's SnapKV,
# ExpectedAttention and TOVA presses (their own defaults), and the dapq rows again in prompt mode.
#
# Sized for one 2-core CPU (about 4 hours): on NIAH, dapq's methods on 4 samples per depth, the
# kvpress presses and prompt mode on the first (--samples N draws the same first samples); on
# RULER, dapq's methods (both modes) and the SnapKV, ExpectedAttention and TOVA presses on 2
# samples per task. KVzipPress rebuilds the context to score it and costs about 5x the
# other presses here, so it runs on the first samples at NIAH budget 128 and RULER 50% only.
# scripts/context-mode-summary.py compares every row on the samples all rows share.
# kvpress runs in a child process ($DAPQ_KVPRESS_PYTHON, or this interpreter if it has kvpress).
set -euo pipefail
out=${1:-docs/results/context-mode}
dapq=${DAPQ:-dapq}
ours="full,dapq,dapq(preset='paper'),deferkv,snapkv,streamingllm"
dapq_rows="full,dapq,dapq(preset='paper')"
peers="kvpress:SnapKVPress,kvpress:ExpectedAttentionPress,kvpress:TOVAPress"

niah=(niah --lengths 4000 --haystack held_out --depths 0,0.25,0.5,0.75,1 --seed 1 --budgets 64,128,256
      --out "$out/niah-4k")
ruler=(ruler --lengths 4000 --seed 1 --out "$out/ruler-4k")

$dapq bench "${niah[@]}" --samples 4 --compress context --methods "$ours"
$dapq bench "${ruler[@]}" --samples 2 --keep-fractions 0.25,0.5 --compress context --methods "$ours"
$dapq bench "${niah[@]}" --samples 1 --compress context --methods "$peers"
$dapq bench "${niah[@]}" --samples 1 --compress prompt --methods "$dapq_rows"
$dapq bench "${ruler[@]}" --samples 2 --keep-fractions 0.25,0.5 --compress prompt --methods "$dapq_rows"
$dapq bench "${niah[@]}" --samples 1 --budgets 128 --compress context --methods kvpress:KVzipPress
$dapq bench "${ruler[@]}" --samples 2 --keep-fractions 0.5 --compress context --methods "$peers"
$dapq bench "${ruler[@]}" --samples 2 --keep-fractions 0.25 --compress context --methods "$peers"
$dapq bench "${ruler[@]}" --samples 1 --keep-fractions 0.5 --compress context --methods kvpress:KVzipPress

$dapq report "$out/niah-4k" > /dev/null
$dapq report "$out/ruler-4k" > /dev/null

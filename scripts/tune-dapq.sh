#!/usr/bin/env bash
# The DapQ defaults search of docs/results/tuning/README.md, as it was run (issue 6).
#
#   scripts/tune-dapq.sh tune STAGE    # STAGE = a | b | c | bc: one stage (or b and c) on the tuning sets
#   scripts/tune-dapq.sh report        # the chosen configurations and baselines on the report sets
#
# Tuning sets: NIAH and RULER at 2k and 4k tokens, seed 0, the essays haystack.
# Report sets: NIAH-4k and RULER-2k, seed 1, the held-out haystack (never used for tuning).
# Every sweep is resumable: re-running a stage only runs the cells that are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
DAPQ=${DAPQ:-.venv/bin/dapq}
OUT=${OUT:-runs}
# Decoding many cells of one prompt together: 32 rows cost about twice 8 rows on this CPU.
BATCH=(--decode-batch "${DECODE_BATCH:-32}")

# Stage a: pseudo content x always-kept recent tokens (the two choices the prototype flagged).
STAGE_A="full,snapkv,pyramidkv,streamingllm"
for content in "preset='paper'" "preset='paper',prefix=0,suffix=32" "preset='paper',content='random_vocab'" "preset='paper',content='fixed'" "preset='paper',content='random_sample'"; do
  for recent in 0 8 16 32; do
    STAGE_A+=",dapq($content$([ "$recent" = 0 ] || echo ",keep_recent=$recent"))"
  done
done
# Stages b and c start from the best stage-a configuration, set in BEST (see the README).
BEST=${BEST:-"preset='paper',content='fixed'"}
STAGE_B="dapq($BEST)"
for opt in "kernel=1" "kernel=5,pooling='avg'" "kernel=13" "query_reduce='max'" "group_reduce='max'" \
           "normalize='all'" "window=8" "window=16" "window=64" "layer_budget='pyramid'"; do
  STAGE_B+=",dapq($BEST,$opt)"
done
BEST_B=${BEST_B:-$BEST}
VARIANTS=""
for a in 0.25 0.5 0.75; do VARIANTS+=",dapq_hybrid($BEST_B,prompt_weight=$a)"; done
for opt in "steps=1" "steps=2" "steps=4" "steps=8" "steps=4,prompt_weight=0.0" "steps=4,prompt_weight=0.25"; do
  VARIANTS+=",deferkv($opt)"
done
STAGE_C="full,snapkv,dapq($BEST_B)$VARIANTS"

tune() {
  local methods=$1
  "$DAPQ" bench niah --lengths 2000,4000 --samples 2 --seed 0 --haystack essays --budgets 64,128 \
    --methods "$methods" --out "$OUT/tune/niah" "${BATCH[@]}"
  "$DAPQ" bench ruler --lengths 2000,4000 --samples 1 --seed 0 --haystack essays --budgets 64,128 \
    --methods "$methods" --out "$OUT/tune/ruler" "${BATCH[@]}"
}

case "${1:-}" in
  tune)
    case "${2:-}" in
      a) tune "$STAGE_A" ;;
      b) tune "$STAGE_B" ;;
      c) tune "$STAGE_C" ;;
      bc) tune "full,snapkv,$STAGE_B$VARIANTS" ;;  # b and c in one pass: one prefill per prompt
      *) echo "usage: $0 tune a|b|c|bc" >&2; exit 2 ;;
    esac ;;
  report)
    FINAL=${FINAL:?set FINAL to the methods of the final tables}
    "$DAPQ" bench niah --lengths 4000 --samples 4 --seed 1 --haystack held_out --budgets 64,128,256 \
      --methods "$FINAL" --out "$OUT/report/niah-4k" "${BATCH[@]}"
    "$DAPQ" bench ruler --lengths 2000 --samples 3 --seed 1 --haystack held_out --budgets 64,128,256 \
      --methods "$FINAL" --out "$OUT/report/ruler-2k" "${BATCH[@]}" ;;
  *) echo "usage: $0 tune a|b|c|bc | report" >&2; exit 2 ;;
esac

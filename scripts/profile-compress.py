"""Where the compression's time goes: torch.profiler, by operator, inside each layer's compression step.

The per-layer compression step of the engine (``dapq.compress._EvictionHooks.apply``: rebuilding the
observation queries, scoring, selecting and gathering the kept keys and values) is wrapped in a
``record_function`` range for the run; every operator called inside a range is charged to the
compression, by its self time. The step exists under this name in every dapq since the method
contract (issue 19), so two versions compare without changing either:

    PYTHONPATH=src .venv/bin/python scripts/profile-compress.py --length 2000
    PYTHONPATH=/path/to/old/checkout/src .venv/bin/python scripts/profile-compress.py --length 2000

Only the public API both versions share is used besides (``load_model``, ``build``, ``generate``).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import dapq

engine = importlib.import_module("dapq.compress")  # the package's `compress` function shadows the module

RANGE = "dapq.compress_step"


def _wrap_step() -> None:
    step = engine._EvictionHooks.apply

    def apply(self, *args, **kwargs):
        with record_function(RANGE):
            return step(self, *args, **kwargs)

    engine._EvictionHooks.apply = apply


def _inside(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == RANGE:
            return True
        parent = parent.cpu_parent
    return False


def compression_profile(model, tokenizer, prompt: str, method, repeats: int) -> tuple[float, dict[str, float]]:
    """(ms per generation inside the compression ranges, self ms per operator inside them)."""
    dapq.generate(model, tokenizer, [prompt], method, max_new_tokens=1)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            dapq.generate(model, tokenizer, [prompt], method, max_new_tokens=1)
    ops: dict[str, float] = defaultdict(float)
    total = 0.0
    for e in prof.events():
        if e.name == RANGE:
            total += e.cpu_time_total / 1000 / repeats
        elif _inside(e):
            ops[e.name] += e.self_cpu_time_total / 1000 / repeats
    return total, ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=2000, help="prompt tokens (about)")
    ap.add_argument("--budget", type=int, default=128)
    ap.add_argument("--methods", default="dapq,snapkv,h2o,streamingllm")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    _wrap_step()
    model, tokenizer = dapq.load_model(None)
    words = ("The grass is green and the sky is blue on a quiet morning in the valley. " * 400).split()
    prompt = " ".join(words)
    while len(tokenizer(prompt)["input_ids"]) > args.length:
        words = words[: int(len(words) * 0.9)]
        prompt = " ".join(words)
    n = len(tokenizer(prompt)["input_ids"])
    full = dapq.build("full")
    dapq.generate(model, tokenizer, [prompt], full, max_new_tokens=1)
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        dapq.generate(model, tokenizer, [prompt], full, max_new_tokens=1)
        walls.append(time.perf_counter() - start)
    forward_ms = 1000 * statistics.median(walls)
    print(f"# Compression profile: {n} prompt tokens, budget {args.budget}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads\n")
    print(f"FullKV prefill + one token: {forward_ms:.0f} ms (median of 3). Each method's compression steps "
          "(all layers) and the operators inside them, by self time, per generation:\n")
    for name in args.methods.split(","):
        total, ops = compression_profile(model, tokenizer, prompt, dapq.build(name, budget=args.budget), args.repeats)
        print(f"## {name}: {total:.1f} ms ({100 * total / forward_ms:.2f}% of the FullKV prefill)\n")
        print("| operator | self ms | share |\n|---|---|---|")
        for key, ms in sorted(ops.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"| {key} | {ms:.2f} | {100 * ms / total:.0f}% |")
        print()


if __name__ == "__main__":
    main()

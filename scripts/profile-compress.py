"""Where the compression's time goes: torch.profiler, by operator, over a FullKV prefill.

Each method's prefill (with its compression) and a FullKV prefill of the same prompt run under
``torch.profiler``; an operator's cost to the compression is its self time with the method minus
its self time without. The table lists the largest such costs per method, so a before/after
comparison of two dapq versions needs no hooks inside either:

    PYTHONPATH=src .venv/bin/python scripts/profile-compress.py --length 2000
    PYTHONPATH=/path/to/old/checkout/src .venv/bin/python scripts/profile-compress.py --length 2000

It uses only the public API both versions share (``load_model``, ``build``, ``generate``).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import dapq


def self_times(model, tokenizer, prompt: str, method, repeats: int) -> dict[str, float]:
    """Mean self time (ms) per operator over ``repeats`` one-token generations."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    dapq.generate(model, tokenizer, [prompt], method, max_new_tokens=1)  # warm-up
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            dapq.generate(model, tokenizer, [prompt], method, max_new_tokens=1)
    device = torch.cuda.is_available()
    out: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        us = e.self_device_time_total if device else e.self_cpu_time_total
        out[e.key] += us / 1000 / repeats
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=2000, help="prompt tokens (about)")
    ap.add_argument("--budget", type=int, default=128)
    ap.add_argument("--methods", default="dapq,snapkv,h2o,streamingllm")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    torch.manual_seed(0)
    model, tokenizer = dapq.load_model(None)
    words = ("The grass is green and the sky is blue on a quiet morning in the valley. " * 400).split()
    prompt = " ".join(words)
    while len(tokenizer(prompt)["input_ids"]) > args.length:
        words = words[: int(len(words) * 0.9)]
        prompt = " ".join(words)
    n = len(tokenizer(prompt)["input_ids"])
    full = self_times(model, tokenizer, prompt, dapq.build("full"), args.repeats)
    total_full = sum(full.values())
    print(f"# Compression profile: {n} prompt tokens, budget {args.budget}, dapq {getattr(dapq, '__version__', '?')}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print(f"FullKV's one-token generation: {total_full:.1f} ms of operator self time.\n")
    for name in args.methods.split(","):
        times = self_times(model, tokenizer, prompt, dapq.build(name, budget=args.budget), args.repeats)
        extra = {k: times.get(k, 0.0) - full.get(k, 0.0) for k in times.keys() | full.keys()}
        added = sum(times.values()) - total_full
        print(f"## {name}: +{added:.1f} ms ({100 * added / total_full:.1f}% of FullKV)\n")
        print("| operator | ms added |\n|---|---|")
        for key, ms in sorted(extra.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"| {key} | {ms:.2f} |")
        print()


if __name__ == "__main__":
    main()

"""Decode throughput of the two cache storages, side by side in one run (issue 20, CPU figures).

    python scripts/decode-modes.py [--context 4000] [--batches 1,8,16,32] [--new 16] [--rounds 2]

One prefill per method on the embedded model (a NIAH-style prompt of --context tokens), then for
each batch size the compressed state is repeated to that batch and decoded --new greedy tokens
with ``decode="eager"`` (a torch.cat per layer and step, dapq <= 0.1) and ``decode="static"``
(buffers sized once, written in place), in turns, --rounds times. Prints a markdown table of
tokens per second (median over rounds), the static/eager ratio of each round's pair, and the
static figure's share of the memory-bandwidth bound: a decode step must read every weight and
every cached key and value once, so ``batch * bandwidth / (weight bytes + batch * KV bytes per
row)`` tokens per second is the most any implementation can reach; the bandwidth is measured
here, as a large tensor copy (bytes read + written per second).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dapq
from dapq.generation import SamplingConfig, decode


def _args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=4000)
    p.add_argument("--batches", default="1,8,16,32")
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--methods", default="full,dapq")
    p.add_argument("--budget", type=int, default=128)
    return p.parse_args()


def _prompt(tok, n: int) -> list[int]:
    filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
    ids = tok(filler * (n // 20 + 1))["input_ids"][: n - 20]
    return ids + tok(" What is the colour of the grass? Answer:")["input_ids"][:20]


def bandwidth() -> float:
    """Bytes per second of a 512 MiB tensor copy, read + written, median of 5."""
    src = torch.rand(128 * 2**20)
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.nbytes / statistics.median(times)


def main() -> None:
    args = _args()
    torch.manual_seed(0)
    model, tok = dapq.load_model()
    model.generation_config.eos_token_id = None  # time exactly --new steps
    prompt = _prompt(tok, args.context)
    bw = bandwidth()
    weights = sum(p.nbytes for p in model.parameters())
    print(f"embedded model, fp32, {torch.get_num_threads()} threads, context {len(prompt)} tokens, "
          f"{args.new} new tokens, {args.rounds} rounds; copy bandwidth {bw / 1e9:.1f} GB/s, "
          f"weights {weights / 2**20:.0f} MiB\n")
    print("| method | batch | KV MiB/row | eager tok/s | static tok/s | static / eager (per round) | bound tok/s | static % of bound |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.methods.split(","):
        method = dapq.build(name) if name == "full" else dapq.build(name, budget=args.budget)
        state = dapq.prefill(model, method, dapq.make_batch(model, method, [prompt], pad_id=0, tokenizer=tok))
        for batch in (int(b) for b in args.batches.split(",")):
            speed = {"eager": [], "static": []}
            for _ in range(args.rounds):
                for mode in ("eager", "static"):
                    copy = state.repeat(batch)  # a fresh cache: decoding appends to it
                    start = time.perf_counter()
                    decode(model, tok, copy, SamplingConfig(max_new_tokens=args.new, decode=mode))
                    speed[mode].append(batch * args.new / (time.perf_counter() - start))
                    del copy
            ratios = [s / e for s, e in zip(speed["static"], speed["eager"], strict=True)]
            kv = state.cache.kv_bytes()
            bound = batch * bw / (weights + batch * kv)
            static = statistics.median(speed["static"])
            print(f"| {name} | {batch} | {kv / 2**20:.1f} | {statistics.median(speed['eager']):.1f} | {static:.1f} | "
                  f"{' / '.join(f'{r:.2f}' for r in ratios)} | {bound:.1f} | {100 * static / bound:.0f}% |", flush=True)


if __name__ == "__main__":
    main()

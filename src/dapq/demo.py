"""``make demo``: a short NIAH comparison on the embedded model, printed as a table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .bench.niah import exact_number_match, make_needle_prompt
from .generation import generate
from .methods import build

DEMO_METHODS = ("full", "streamingllm", "snapkv", "dapq")


def run_demo(model, tokenizer, *, length: int = 2000, depths=(0.0, 0.25, 0.5, 0.75, 1.0), budgets=(64, 128)):
    """Run every (method, budget) on one batch of needle prompts and print accuracy and KV memory."""
    console = Console()
    samples = [make_needle_prompt(tokenizer, length, d) for d in depths]
    cells = [("full", None)] + [(m, b) for b in budgets for m in DEMO_METHODS if m != "full"]
    table = Table(title=f"Needle in a haystack, {length} tokens, {len(samples)} depths (SmolLM2-135M-Instruct)")
    for col in ("method", "budget", "accuracy", "KV kept / full", "KV MiB", "prefill s", "compress s"):
        table.add_column(col, justify="right" if col != "method" else "left")
    rows = []
    for name, budget in cells:
        method = build(name) if budget is None else build(name, budget=budget)
        with console.status(f"{name} budget={budget or 'all'}"):
            results = []
            for s in samples:  # one prompt at a time: all samples share a length, and memory stays small
                results += generate(
                    model, tokenizer, [s.prompt], method, chat=True, answer_prefix=s.answer_prefix, max_new_tokens=12
                )
        acc = sum(exact_number_match(r.text, s.reference) for r, s in zip(results, samples, strict=True)) / len(samples)
        kept = sum(r.kv_bytes_kept for r in results) / len(results)
        full = sum(r.kv_bytes_full for r in results) / len(results)
        prefill_s = sum(r.prefill_s for r in results) / len(results)
        compress_s = sum(r.compress_s for r in results) / len(results)
        row = (name, str(budget or "all"), f"{acc:.0%}", f"{kept / full:.1%}", f"{kept / 2**20:.1f}",
               f"{prefill_s:.2f}", f"{compress_s:.3f}")
        rows.append(row)
        table.add_row(*row)
    console.print(table)
    return rows

"""``make demo``: a short NIAH comparison on the embedded model, run through the bench runner."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .bench.report import table
from .bench.runner import run_sweep
from .bench.store import ResultsStore, cell_key
from .bench.tasks import TaskArgs, build_samples
from .methods.spec import parse_methods
from .tables import markdown

DEMO_METHODS = "full,streamingllm,snapkv,dapq"
DEMO_BUDGETS = (64, 128)


def run_demo(model, tokenizer, *, length: int = 2000, out: Path = Path("runs/demo"), model_id: str = "smollm2-135m"):
    """NIAH at one length and 5 depths; results are kept in ``out`` so a re-run is instant.

    The haystack is RULER's noise filler (S-NIAH-1): on this 135M model the prose haystack
    defeats every method at these budgets (see docs/results), which would show no contrast.
    """
    console = Console()
    samples = build_samples("niah", tokenizer, TaskArgs(lengths=(length,), samples=1, haystack="noise",
                                                          max_context=model.config.max_position_embeddings))
    store = ResultsStore(out)
    specs = parse_methods(DEMO_METHODS)
    run_sweep(model, tokenizer, samples, specs, list(DEMO_BUDGETS), store, model_id=model_id)
    # Only this version's configurations: a store kept from before a default changed also holds
    # cells of the old ``dapq``, under the same label.
    current = {cell_key(config=spec.build(b).config()) for spec in specs for b in DEMO_BUDGETS}
    records = [r for r in store if r["sample_id"] in {s.sample_id for s in samples}
               and cell_key(config=r["config"]) in current]
    header, rows = table(records, "niah")
    console.print(f"\nNeedle in a haystack, {length} tokens, {len(samples)} depths, noise haystack ({model_id})\n")
    console.print(markdown(header, rows), markup=False)
    console.print(f"\nresults: {store.path}   (dapq report {out} renders plots)")
    return rows

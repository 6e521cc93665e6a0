"""Drivers of ``dapq analyze``: prompts from the bench task sets, resumable per-prompt records,
tables and plots. Every measurement goes through :mod:`dapq.analysis.decode`, the compression
engine and the scoring toolkit; nothing here scores on its own."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from rich.progress import track

from ..bench.runner import run_sweep
from ..bench.store import ResultsStore, cell_key
from ..bench.tasks import Sample
from ..methods import method_class
from ..methods.spec import MethodSpec, parse_methods
from ..prompts import encode_prompts
from ..tables import markdown
from .decode import prompt_cache, trace_decode
from .recall import method_recall, oracle_topk
from .similarity import CONDITIONS, offset_curve, similarity_trial

WINDOWS = (1, 2, 4, 8, 16, 32, 64, 128)
OFFSETS = (-2048, -1024, -512, -128, -32, 0, 32, 64, 128, 256, 512)
# Figure 4 varies one choice of the paper's recipe at a time, so every cell starts from the
# ``paper`` preset (not from dapq's tuned defaults).
_PAPER = "dapq(preset='paper',{})"
ABLATIONS = {
    "a": tuple(_PAPER.format(c) for c in (
        "prefix=8,suffix=24", "prefix=2,suffix=30", "prefix=16,suffix=16", "prefix=0,suffix=32",
        "content='random_sample'", "content='random_span'", "content='fixed'", "content='random_vocab'")),
    "b": tuple(_PAPER.format(f"n_pseudo={w}") for w in (8, 16, 32, 64, 128)),
    "c": tuple(_PAPER.format(c) for c in (
        "inside_part=1", "inside_part=2", "inside_part=3", "position_offset=0", "position_offset=32",
        "position_offset=64", "position_offset=128")),
}


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def _prompts(tokenizer, samples: list[Sample]):
    for s in samples:
        yield s, encode_prompts(tokenizer, [s.prompt], chat=s.chat, answer_prefix=s.answer_prefix)[0]


# --------------------------------------------------------------------------- similarity
def run_similarity(model, tokenizer, samples, store: ResultsStore, *, model_id: str, window: int = 32, seed: int = 0):
    for s, ids in track(list(_prompts(tokenizer, samples)), description="similarity"):
        key = cell_key(analysis="similarity", model=model_id, sample=s.sample_id, prompt=s.prompt, window=window,
                       seed=seed)
        if key in store:
            continue
        cache = prompt_cache(model, ids)
        trace = trace_decode(model, ids, window, cache=cache)
        store.append({
            "key": key, "analysis": "similarity", "model": model_id, "taskset": s.taskset, "task": s.task,
            "sample_id": s.sample_id, "prompt_tokens": len(ids), "window": window,
            "conditions": similarity_trial(model, cache, trace, n=window, seed=seed),
            "offsets": offset_curve(model, cache, trace, n=window, offsets=list(OFFSETS)),
        })


def similarity_table(records: list[dict]) -> tuple[list[str], list[list[str]]]:
    rs = [r for r in records if r.get("analysis") == "similarity"]
    header = ["condition", "post-RoPE", "pre-RoPE", "trials"]
    rows = []
    for cond in CONDITIONS:
        post = [_mean(r["conditions"][cond]["post"]) for r in rs]
        pre = [_mean(r["conditions"][cond]["pre"]) for r in rs]
        rows.append([cond, f"{_mean(post):.3f}", f"{_mean(pre):.3f}", str(len(rs))])
    return header, rows


def plot_similarity(records: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = [r for r in records if r.get("analysis") == "similarity"]
    if not rs:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, kind in zip(axes, ("post", "pre"), strict=True):
        data = [[_mean(r["conditions"][c][kind]) for r in rs] for c in CONDITIONS]
        ax.boxplot(data)
        ax.set_xticks(range(1, len(CONDITIONS) + 1), CONDITIONS)
        ax.set_title(f"{kind}-RoPE query similarity ({len(rs)} prompts)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cosine similarity to real decode queries")
    fig.tight_layout()
    box = out / "similarity-box.png"
    fig.savefig(box, dpi=120)
    plt.close(fig)
    curve: dict[int, list[float]] = defaultdict(list)
    for r in rs:
        for off, v in r["offsets"].items():
            curve[int(off)].append(v)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = sorted(curve)
    ax.plot(xs, [_mean(curve[x]) for x in xs], marker="o")
    ax.axvline(0, color="grey", linestyle="--")
    ax.set_xscale("symlog", linthresh=32)
    ax.set_xlabel("pseudo start offset from Lp (same content)")
    ax.set_ylabel("post-RoPE cosine similarity")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    line = out / "similarity-offset.png"
    fig.savefig(line, dpi=120)
    plt.close(fig)
    return [box, line]


# --------------------------------------------------------------------------- recall
def _spec_variants(specs: list[MethodSpec], windows) -> list[tuple[str, str, int | None, MethodSpec]]:
    """(label, method name, window, spec) for each method, across windows where it has one."""
    out = []
    for spec in specs:
        cls = method_class(spec.name)
        # Only observation windows are swept (SnapKV's last-W queries, DapQ's N pseudo queries);
        # the oracle's reference steps are not a window.
        param = cls.window_param
        if windows and param and not cls.analysis_only and param not in dict(spec.params):
            for w in windows:
                out.append((spec.label, spec.name, w, MethodSpec(spec.label, spec.name, spec.params + ((param, w),))))
        else:
            out.append((spec.label, spec.name, None, spec))
    return out


def run_recall(model, tokenizer, samples, store: ResultsStore, *, model_id: str, methods: str, budget: int,
               windows=WINDOWS, steps: int = 32, analysis: str = "recall"):
    variants = _spec_variants(parse_methods(methods), windows)
    n_kv = model.config.num_key_value_heads
    for s, ids in track(list(_prompts(tokenizer, samples)), description=analysis):
        todo = []
        for label, name, window, spec in variants:
            method = spec.build(budget)
            key = cell_key(analysis=analysis, model=model_id, sample=s.sample_id, prompt=s.prompt,
                           config=method.config(), steps=steps)
            if key not in store:
                todo.append((label, name, window, method, key))
        if not todo:
            continue
        cache = prompt_cache(model, ids)
        trace = trace_decode(model, ids, steps, cache=cache)
        reference = oracle_topk(trace, budget, n_kv)
        for label, name, window, method, key in todo:
            result = method_recall(model, cache, ids, trace, method, reference, tokenizer=tokenizer)
            store.append({
                "key": key, "analysis": analysis, "model": model_id, "taskset": s.taskset, "task": s.task,
                "sample_id": s.sample_id, "prompt_tokens": len(ids), "label": label, "method": name,
                "window": window, "budget": budget, "steps": steps, "config": method.config(), **result,
            })


def recall_tables(records: list[dict], analysis: str = "recall"):
    """(Table 8 analogue: cosine by window, Figure 3 analogue: recall by window)."""
    rs = [r for r in records if r.get("analysis") == analysis]
    windows = sorted({r["window"] for r in rs if r["window"] is not None})
    labels = list(dict.fromkeys(r["label"] for r in rs))
    tables = []
    for metric in ("cosine", "recall"):
        header = ["method"] + [str(w) for w in windows] + (["no window"] if any(r["window"] is None for r in rs) else [])
        rows = []
        for label in labels:
            row = [label]
            for w in windows + ([None] if header[-1] == "no window" else []):
                vals = [_mean(r[metric]) for r in rs if r["label"] == label and r["window"] == w and r[metric]]
                row.append(f"{statistics.fmean(vals):.3f}" if vals else "-")
            rows.append(row)
        tables.append((header, rows))
    return tables


def plot_recall(records: list[dict], out: Path, analysis: str = "recall") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = [r for r in records if r.get("analysis") == analysis]
    if not rs:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    by: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    layer_curves: dict[str, list[list[float]]] = defaultdict(list)
    for r in rs:
        by[r["label"]][r["window"]].append(_mean(r["recall"]))
        if r["window"] in (None, 32):
            layer_curves[r["label"]].append(r["recall"])
    for label, per_w in by.items():
        ws = sorted(w for w in per_w if w is not None)
        if ws:
            axes[0].plot(ws, [_mean(per_w[w]) for w in ws], marker="o", label=label)
        elif None in per_w:
            axes[0].axhline(_mean(per_w[None]), linestyle="--", label=label, color="grey")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("window (observation / pseudo queries)")
    axes[0].set_ylabel("recall of the oracle top-K")
    axes[0].legend(fontsize=8)
    for label, curves in layer_curves.items():
        n_layers = len(curves[0])
        axes[1].plot(range(n_layers), [_mean([c[i] for c in curves]) for i in range(n_layers)], label=label)
    axes[1].set_xlabel("layer")
    axes[1].set_ylabel("recall (window 32)")
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / f"{analysis}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def render(out: Path) -> str:
    """Markdown of every analysis found in ``out``'s results file, plus plots."""
    records = list(ResultsStore.open_existing(out))
    parts = []
    if any(r.get("analysis") == "similarity" for r in records):
        parts += ["## Query similarity (Table 1 analogue)", "", markdown(*similarity_table(records))]
        parts += [f"![{p.stem}]({p.name})" for p in plot_similarity(records, out)]
    for analysis in ("recall", "ablation"):
        if any(r.get("analysis") == analysis for r in records):
            cos_t, rec_t = recall_tables(records, analysis)
            parts += ["", f"## {analysis}: distribution cosine to real decoding attention (Table 8 analogue)", "",
                      markdown(*cos_t), "", f"## {analysis}: recall of the oracle top-K (Figure 3 analogue)", "",
                      markdown(*rec_t)]
            parts += [f"![{p.stem}]({p.name})" for p in plot_recall(records, out, analysis)]
    text = "\n".join(parts) + "\n"
    (out / "analysis.md").write_text(text, encoding="utf-8")
    return text


def run_ablation(model, tokenizer, samples, out: Path, *, model_id: str, part: str, budget: int, steps: int = 32,
                 accuracy: bool = True):
    """Figure 4 (a) content, (b) window, (c) positions: recall for every prompt, and accuracy
    through the bench runner (its own resumable store under ``out/accuracy``)."""
    specs = ",".join(ABLATIONS[part])
    run_recall(model, tokenizer, samples, ResultsStore(out), model_id=model_id, methods=specs, budget=budget,
               windows=(), steps=steps, analysis="ablation")
    if accuracy:
        acc = ResultsStore(out / "accuracy")
        run_sweep(model, tokenizer, samples, parse_methods("full," + specs), [budget], acc, model_id=model_id)
        return acc
    return None

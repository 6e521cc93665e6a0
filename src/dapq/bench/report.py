"""``dapq report``: paper-style tables and plots rendered from a results file alone.

Works on a partial sweep: cells that have not run are shown as "-" and left out of averages.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ..tables import markdown
from .speed_report import render_speed
from .store import ResultsStore

TASK_ORDER = {
    "ruler": ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
              "niah_multikey_3", "niah_multiquery", "niah_multivalue", "cwe", "fwe", "vt"),
    "longbench": ("qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec",
                  "triviaqa", "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p"),
    # LongBench v2's result.py: Overall, Easy, Hard, Short, Medium, Long.
    "longbench-v2": ("longbench-v2", "longbench-v2:easy", "longbench-v2:hard", "longbench-v2:short",
                     "longbench-v2:medium", "longbench-v2:long"),
    # The DapQ paper's Table 14.
    "helmet": ("icl_banking77", "icl_clinic150", "icl_nlu", "icl_trec_coarse", "icl_trec_fine", "narrativeqa",
               "infbench_qa_eng", "kilt_hotpotqa", "kilt_nq", "kilt_popqa_3", "kilt_triviaqa"),
}
DISPLAY = {
    "niah_single_1": "S-NIAH-1", "niah_single_2": "S-NIAH-2", "niah_single_3": "S-NIAH-3",
    "niah_multikey_1": "MK-NIAH-1", "niah_multikey_2": "MK-NIAH-2", "niah_multikey_3": "MK-NIAH-3",
    "niah_multiquery": "MQ-NIAH", "niah_multivalue": "MV-NIAH", "vt": "VT", "cwe": "CWE", "fwe": "FWE",
    "niah": "NIAH", "niah_sentence": "NIAH-sentence",
    "longbench-v2": "Overall", "longbench-v2:easy": "Easy", "longbench-v2:hard": "Hard",
    "longbench-v2:short": "Short", "longbench-v2:medium": "Medium", "longbench-v2:long": "Long",
}
# Decimals of a task's score: LongBench's eval.py reports round(100 * mean, 2); others one decimal
# (LongBench v2's result.py rounds to 1).
DIGITS = {"longbench": 2}


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def _percent(mean: float, digits: int) -> str:
    """``round(100 * mean, digits)``, LongBench's and LongBench v2's rounding, shown with ``digits`` decimals."""
    return f"{round(100 * mean, digits):.{digits}f}"


def _row_key(r: dict) -> tuple:
    """(label, budget, kept fraction, compress mode, peer): one table row."""
    return r["label"], r.get("budget"), r.get("keep_fraction"), r.get("compress") or "prompt", r.get("peer")


def _sort_rows(keys):
    # Prompt mode before context mode; FullKV first, then budgets, then kept fractions (small to large),
    # then dapq's methods before peers, by label: the paper's layout.
    return sorted(keys, key=lambda k: (k[3] != "prompt", k[0] != "full", k[2] is not None, k[1] or k[2] or 0,
                                       k[4] is not None, k[0]))


def _label(key: tuple) -> str:
    return f"{key[0]} (kvpress peer)" if key[4] else key[0]


def _size(key: tuple) -> str:
    """The budget column: tokens per KV head, or the share of the prompt kept (--keep-fractions)."""
    return str(key[1]) if key[1] is not None else f"{100 * key[2]:g}%" if key[2] is not None else "all"


def expand(records: list[dict]) -> list[dict]:
    """Records plus derived columns (LongBench-v2 splits count as extra tasks)."""
    out = []
    for r in records:
        out.append(r)
        for split in r.get("meta", {}).get("splits", ()):
            out.append({**r, "task": f"{r['task']}:{split}"})
    return out


def table(records: list[dict], taskset: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows: method x budget by task, the average, % of FullKV, KV kept (share, MiB)."""
    rs = [r for r in expand(records) if r["taskset"] == taskset]
    present = {r["task"] for r in rs}
    order = [t for t in TASK_ORDER.get(taskset, ()) if t in present]
    order += sorted(present - set(order))
    scores: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    kv: dict[tuple, list[float]] = defaultdict(list)
    kv_mib: dict[tuple, list[float]] = defaultdict(list)
    for r in rs:
        scores[_row_key(r)][r["task"]].append(r["score"])
        if ":" not in r["task"]:
            kv[_row_key(r)].append(r["kv_bytes_kept"] / max(r["kv_bytes_full"], 1))
            kv_mib[_row_key(r)].append(r["kv_bytes_kept"] / 2**20)
    base_tasks = [t for t in order if ":" not in t]
    averages = {k: _mean([_mean(v[t]) for t in base_tasks if v.get(t)]) for k, v in scores.items()}
    # "% of FullKV" compares with FullKV in the same mode: context mode answers other inputs.
    full_avg = {k[3]: a for k, a in averages.items() if k[0] == "full"}
    modes = any(k[3] != "prompt" for k in scores)
    header = (["method", "budget"] + (["compress"] if modes else []) + [DISPLAY.get(t, t) for t in order]
              + ["avg", "% of FullKV", "KV kept", "KV MiB"])
    digits = DIGITS.get(taskset, 1)
    rows = []
    for key in _sort_rows(scores):
        cells = [_percent(m, digits) if (m := _mean(scores[key].get(t, []))) is not None else "-" for t in order]
        avg, full = averages[key], full_avg.get(key[3])
        rel = f"{100 * avg / full:.1f}" if avg is not None and full else "-"
        rows.append([_label(key), _size(key), *([key[3]] if modes else []), *cells,
                     _percent(avg, digits) if avg is not None else "-", rel,
                     f"{100 * _mean(kv[key]):.1f}%" if kv[key] else "-",
                     f"{_mean(kv_mib[key]):.1f}" if kv_mib[key] else "-"])
    return header, rows


def length_table(records: list[dict], taskset: str) -> tuple[list[str], list[list[str]]] | None:
    """Average score by prompt length (tasks averaged per length), or None for a single length."""
    rs = [r for r in records if r["taskset"] == taskset and "length" in r.get("meta", {})]
    lengths = sorted({r["meta"]["length"] for r in rs})
    if len(lengths) < 2:
        return None
    scores: dict[tuple, dict[int, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in rs:
        scores[_row_key(r)][r["meta"]["length"]][r["task"]].append(r["score"])
    modes = any(k[3] != "prompt" for k in scores)
    header = ["method", "budget"] + (["compress"] if modes else []) + [f"{length} tok" for length in lengths] + ["avg"]
    rows = []
    for key in _sort_rows(scores):
        per = [_mean([_mean(v) for v in scores[key][length].values()]) for length in lengths]
        done = [p for p in per if p is not None]
        rows.append([_label(key), _size(key), *([key[3]] if modes else []),
                     *(f"{100 * p:.1f}" if p is not None else "-" for p in per),
                     f"{100 * _mean(done):.1f}" if done else "-"])
    return header, rows



def plot_budget_curves(records: list[dict], taskset: str, path: Path, *, by: str = "budget") -> Path | None:
    """Average score against budget (or kept fraction), one line per method and mode; FullKV dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = [r for r in records if r["taskset"] == taskset]
    per: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    full: dict[str, list[float]] = defaultdict(list)
    for r in rs:
        key = _row_key(r)
        mode = "" if key[3] == "prompt" else f" [{key[3]}]"
        if r["label"] == "full":  # FullKV's label is its name: it takes no parameter
            full[mode].append(r["score"])
        elif r.get(by) is not None:
            per[_label(key) + mode][r[by]].append(r["score"])
    if not per:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, by_size in sorted(per.items()):
        xs = sorted(by_size)
        ax.plot(xs, [100 * _mean(by_size[x]) for x in xs], marker="o", label=label)
    for mode, scores in sorted(full.items()):
        ax.axhline(100 * _mean(scores), color="black", linestyle="--" if not mode else ":", label="full" + mode)
    sizes = sorted({x for by_size in per.values() for x in by_size})
    if by == "budget":
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("KV budget (tokens per head per layer)")
    else:
        ax.set_xticks(sizes, [f"{100 * x:g}%" for x in sizes])
        ax.set_xlabel("share of the prompt (or context) kept")
    ax.set_ylabel("score (%)")
    ax.set_title(f"{taskset}: score vs {by}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_niah_heatmaps(records: list[dict], out_dir: Path) -> list[Path]:
    """Depth x length heatmap per (method, budget), like the paper's Figure 5."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = [r for r in records if r["taskset"] == "niah"]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rs:
        groups[_row_key(r)].append(r)
    paths = []
    for key, group in _sorted_groups(groups):
        lengths = sorted({r["meta"]["length"] for r in group})
        depths = sorted({r["meta"]["depth"] for r in group})
        grid = [[_mean([r["score"] for r in group if r["meta"]["length"] == n and r["meta"]["depth"] == d])
                 for n in lengths] for d in depths]
        fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 3.2))
        values = [[float("nan") if v is None else 100 * v for v in row] for row in grid]
        im = ax.imshow(values, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths])
        ax.set_xlabel("context length")
        ax.set_ylabel("needle depth")
        title = f"{_label(key)} budget={_size(key)}" + (f" ({key[3]} mode)" if key[3] != "prompt" else "")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        name = f"{key[0]}-{_size(key)}" + (f"-{key[3]}" if key[3] != "prompt" else "")
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
        path = out_dir / f"niah-heatmap-{safe}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _sorted_groups(groups):
    return [(k, groups[k]) for k in _sort_rows(groups)]


def render(out_dir: str | Path, *, plots: bool = True) -> str:
    """Write ``report.md`` (+ PNGs) into the sweep directory and return the markdown."""
    out = Path(out_dir)
    records = list(ResultsStore.open_existing(out))
    parts = [f"# dapq report: {out}", "", f"{len(records)} finished cells."]
    for taskset in sorted({r["taskset"] for r in records}):
        if taskset == "speed":
            parts += ["", "## speed", "", render_speed(records)]
            continue
        header, rows = table(records, taskset)
        parts += ["", f"## {taskset}", "", markdown(header, rows)]
        if any(r.get("peer") for r in records if r["taskset"] == taskset):
            version = next((r["config"].get("kvpress_version") for r in records
                            if r.get("peer") and r["taskset"] == taskset), "?")
            parts += ["", f"Rows marked (kvpress peer) ran through kvpress {version}'s own pipeline "
                          "(`KVPressTextGenerationPipeline`) on the same token ids, keeping as many context "
                          "tokens per KV head as the budget says."]
            masking = sorted({r["label"] for r in records if r["taskset"] == taskset
                              and r["config"].get("masked_fraction")})
            if masking:
                parts += ["", f"{', '.join(masking)}: kvpress masks the evicted keys per head instead of "
                              "removing them, so the cache keeps its full size. KV kept and KV MiB are the "
                              "memory held; the attention sees the budget."]
        if any((r.get("compress") or "prompt") == "context" for r in records if r["taskset"] == taskset):
            parts += ["", "compress = context: only the context was compressed; the question was fed after it "
                          "uncompressed. % of FullKV compares with FullKV in the same mode."]
        by_length = length_table(records, taskset)
        if by_length:
            parts += ["", f"### {taskset}: average by prompt length", "", markdown(*by_length)]
        if plots:
            for by in ("budget", "keep_fraction"):
                p = plot_budget_curves(records, taskset, out / f"{taskset}-{by}.png", by=by)
                if p:
                    parts += ["", f"![{taskset} score vs {by}]({p.name})"]
            if taskset == "niah":
                for h in plot_niah_heatmaps(records, out):
                    parts.append(f"![{h.stem}]({h.name})")
    text = "\n".join(parts) + "\n"
    (out / "report.md").write_text(text, encoding="utf-8")
    return text

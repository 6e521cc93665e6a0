"""``dapq report``: paper-style tables and plots rendered from a results file alone.

Works on a partial sweep: cells that have not run are shown as "-" and left out of averages.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..errors import DapqError
from ..tables import markdown
from . import stats
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


# The fields each kind of record needs to be reported; a record without them (edited by hand,
# or cut down by a tool) is left out with one warning rather than failing the whole report.
_NEEDS = {
    "accuracy": ("taskset", "task", "label", "score", "kv_bytes_kept", "kv_bytes_full"),
    "speed": ("taskset", "model", "device", "dtype", "cell", "label"),
    "ttft": ("ttft_s", "forward_s"),
    "decode": ("tokens_per_s",),
}


def usable(records: list[dict], *, warn: bool = True) -> list[dict]:
    """The records that carry every field the report reads; one stderr line counts the others."""
    kept, missing = [], set()
    for r in records:
        kind = "speed" if r.get("taskset") == "speed" else "accuracy"
        needs = _NEEDS[kind]
        if kind == "speed" and not (r.get("oom") or r.get("error")):
            needs = needs + _NEEDS.get(r.get("cell"), ())
        lacking = [f for f in needs if f not in r]
        if lacking:
            missing.update(lacking)
        else:
            kept.append(r)
    if warn and len(kept) < len(records):
        print(f"dapq: warning: {len(records) - len(kept)} record(s) lack fields the report needs "
              f"({', '.join(sorted(missing))}) and are left out", file=sys.stderr)
    return _separate_configs(kept, warn=warn)


def _separate_configs(records: list[dict], *, warn: bool) -> list[dict]:
    """Rows that mix method configurations, split so that no average pools two of them.

    A store resumed by a dapq whose defaults changed gets new cells (the key holds the whole
    config) under the old label, e.g. two kinds of ``dapq`` row. The newest record's config keeps
    the label; records with another one are relabelled by the fields that differ, as
    ``dapq[position_offset=0]``. Only fields both configs carry are compared, so a field added in
    a later version (with the old behaviour as its default) does not split a row. kvpress rows are
    left alone: their config holds per-prompt figures.
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("taskset") != "speed" and isinstance(r.get("config"), dict) and not r.get("peer"):
            groups[(r["taskset"], *_row_key(r))].append(r)
    relabelled: dict[int, dict] = {}
    for group in groups.values():
        newest = group[-1]["config"]
        for r in group[:-1]:
            differ = [k for k in newest if k in r["config"] and r["config"][k] != newest[k]]
            if differ:
                old = r["config"]
                relabelled[id(r)] = {**r, "label": f"{r['label']}[{','.join(f'{k}={old[k]!r}' for k in differ)}]"}
    if warn and relabelled:
        names = sorted({r["label"] for r in relabelled.values()})
        print(f"dapq: warning: some rows mix method configurations (records from dapq versions with other "
              f"defaults?); the older ones are shown apart as {', '.join(names)}", file=sys.stderr)
    return [relabelled.get(id(r), r) for r in records]


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
    rs = [r for r in expand(usable(records, warn=False)) if r["taskset"] == taskset]
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


def _per_prompt(records: list[dict], taskset: str) -> dict[tuple, dict[tuple, float]]:
    """Row key -> {(task, sample_id): score} over the task set's own tasks (no derived splits)."""
    rows: dict[tuple, dict[tuple, float]] = defaultdict(dict)
    for r in usable(records, warn=False):
        if r["taskset"] == taskset:
            rows[_row_key(r)][(r["task"], r.get("sample_id", r["key"]))] = r["score"]
    return rows


def _by_task(scores: dict[tuple, float]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for (task, _), value in sorted(scores.items(), key=lambda kv: str(kv[0])):
        out[task].append(value)
    return out


def interval_tables(records: list[dict], taskset: str) -> tuple[tuple, tuple]:
    """Two tables with n and the 95% interval: each row's average, and each (row, task) cell."""
    rows = _per_prompt(records, taskset)
    modes = any(k[3] != "prompt" for k in rows)
    lead = ["method", "budget"] + (["compress"] if modes else [])
    avg_rows, cell_rows = [], []
    for key in _sort_rows(rows):
        by_task = _by_task(rows[key])
        head = [_label(key), _size(key), *([key[3]] if modes else [])]
        ci = stats.average_interval(by_task)
        counts = sorted({len(v) for v in by_task.values()})
        per_task = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        avg_rows.append([*head, str(len(by_task)), per_task, ci.points(), ci.how])
        for task, values in sorted(by_task.items(), key=lambda kv: _task_rank(taskset, kv[0])):
            cell = stats.interval(values)
            cell_rows.append([*head, DISPLAY.get(task, task), str(cell.n), cell.points(), cell.how])
    return ((lead + ["tasks", "prompts per task", "avg [95% interval]", "interval"], avg_rows),
            (lead + ["task", "n", "score [95% interval]", "interval"], cell_rows))


def _task_rank(taskset: str, task: str) -> tuple:
    order = TASK_ORDER.get(taskset, ())
    return (order.index(task), task) if task in order else (len(order), task)


def paired_table(records: list[dict], taskset: str, against: str) -> tuple[list[str], list[list[str]]] | None:
    """Each row against ``against`` at the same budget and mode, on the prompts both ran.

    FullKV as the reference is compared with every budget. The difference is in points; the
    verdict says better or worse only where the 95% interval excludes zero.
    """
    rows = _per_prompt(records, taskset)
    refs = {k: v for k, v in rows.items() if k[0] == against}
    if not refs:
        return None
    modes = any(k[3] != "prompt" for k in rows)
    header = (["method", "budget"] + (["compress"] if modes else [])
              + [f"n shared with {against}", "difference, points [95% interval]", "won / lost / tied",
                 "sign test p", "verdict"])
    out = []
    for key in _sort_rows(rows):
        if key[0] == against:
            continue
        ref_key = next((r for r in refs if r[3] == key[3] and (r[1:3] == key[1:3] or r[1:3] == (None, None))), None)
        result = stats.paired(rows[key], refs[ref_key]) if ref_key else None
        if result is None:
            continue
        ci = (f"{100 * result.diff:+.1f} [{100 * result.low:+.1f}, {100 * result.high:+.1f}]"
              if np.isfinite(result.low) else f"{100 * result.diff:+.1f} [n/a: one prompt]")
        out.append([_label(key), _size(key), *([key[3]] if modes else []), str(result.n), ci,
                    f"{result.won} / {result.lost} / {result.tied}", f"{result.sign_p:.3g}", result.verdict])
    return header, out


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

    rs = [r for r in records if r["taskset"] == taskset and ":" not in r["task"]]
    # Line -> size -> task -> scores, so each point is the table's average (mean of task means).
    per: dict[str, dict[float, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    full: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rs:
        key = _row_key(r)
        mode = "" if key[3] == "prompt" else f" [{key[3]}]"
        if r["label"] == "full":  # FullKV's label is its name: it takes no parameter
            full[mode][r["task"]].append(r["score"])
        elif r.get(by) is not None:
            per[_label(key) + mode][r[by]][r["task"]].append(r["score"])
    if not per:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, by_size in sorted(per.items()):
        xs = sorted(by_size)
        cis = [stats.average_interval(by_size[x]) for x in xs]
        ys = [100 * c.mean for c in cis]
        # A 95% interval per point (error bars), as in the intervals table; none where it is undefined.
        err = [[max(0.0, y - 100 * c.low) if np.isfinite(c.low) else 0.0 for y, c in zip(ys, cis, strict=True)],
               [max(0.0, 100 * c.high - y) if np.isfinite(c.high) else 0.0 for y, c in zip(ys, cis, strict=True)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
    for mode, by_task in sorted(full.items()):
        ci = stats.average_interval(by_task)
        ax.axhline(100 * ci.mean, color="black", linestyle="--" if not mode else ":", label="full" + mode)
        if np.isfinite(ci.low):
            ax.axhspan(100 * ci.low, 100 * ci.high, color="black", alpha=0.08)
    sizes = sorted({x for by_size in per.values() for x in by_size})
    if by == "budget":
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("KV budget (tokens per head per layer)")
    else:
        ax.set_xticks(sizes, [f"{100 * x:g}%" for x in sizes])
        ax.set_xlabel("share of the prompt (or context) kept")
    ax.set_ylabel("score (%)")
    ax.set_title(f"{taskset}: score vs {by} (95% intervals)")
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


def render(out_dir: str | Path, *, plots: bool = True, against: str | None = None,
           output: str | Path | None = None) -> str:
    """Write ``report.md`` (+ PNGs) into the sweep directory and return the markdown.

    Each accuracy table is followed by its uncertainty (:mod:`dapq.bench.stats`): every row's
    average and every cell with n and a 95% interval; with ``against``, each row's paired
    difference to that method on the prompts both ran.

    ``output`` names another file for the markdown, so that reports against several methods can
    sit side by side without overwriting ``report.md``; the PNGs stay in the sweep directory and
    the markdown links them relative to wherever it is written.
    """
    out = Path(out_dir)
    target = Path(output) if output is not None else out / "report.md"
    records = usable(list(ResultsStore.open_existing(out)))
    labels = sorted({r["label"] for r in records if r["taskset"] != "speed"})
    if against is not None and against not in labels:
        raise DapqError(f"--against {against}: no such rows in {out}; its labels are {', '.join(labels) or 'none'}")
    parts = [f"# dapq report: {out}", "", f"{len(records)} finished cells."]
    files = _Files(out)
    for taskset in sorted({r["taskset"] for r in records}):
        if taskset == "speed":
            parts += ["", "## speed", "", render_speed(records)]
            continue
        header, rows = table(records, taskset)
        parts += ["", f"## {taskset}", "", markdown(header, rows)]
        parts += _uncertainty(records, taskset, against)
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
                p = files.write(plot_budget_curves, records, taskset, out / f"{taskset}-{by}.png", by=by)
                if p:
                    parts += ["", f"![{taskset} score vs {by}]({_link(p, target)})"]
            if taskset == "niah":
                for h in files.write(plot_niah_heatmaps, records, out) or ():
                    parts.append(f"![{h.stem}]({_link(h, target)})")
    text = "\n".join(parts) + "\n"
    files.write(lambda: target.write_text(text, encoding="utf-8"))
    return text


def _link(image: Path, report: Path) -> str:
    """The image's path as a markdown file at ``report`` links it (a bare name beside it)."""
    return Path(os.path.relpath(image.resolve(), report.resolve().parent)).as_posix()


def _uncertainty(records: list[dict], taskset: str, against: str | None) -> list[str]:
    """The report's sections of n, intervals and (with ``against``) paired differences for one task set."""
    averages, cells = interval_tables(records, taskset)
    parts = ["", f"### {taskset}: n and 95% intervals", "",
             "Scores in points. A cell whose scores are all 0 or 1 gets the exact (Clopper-Pearson) binomial "
             "interval; other cells a BCa bootstrap over prompts. A row's average (the mean of its task means) gets "
             f"a bootstrap that resamples each task's prompts on its own once every task has {stats.MIN_STRATUM} "
             "prompts, and pools them below that (or, for 0/1 scores and as many prompts in every task, the exact "
             "binomial of the pooled prompts). The interval column says which.", "", markdown(*averages)]
    if len(cells[1]) > len(averages[1]):  # several tasks a row: each cell too
        parts += ["", markdown(*cells)]
    if against:
        compared = paired_table(records, taskset, against)
        parts += ["", f"### {taskset}: paired difference to {against}", ""]
        if compared is None:
            parts.append(f"No {against} rows in {taskset}.")
        else:
            parts += [f"Each row minus {against} at the same budget and mode (FullKV: at any budget), on the "
                      "prompts both ran, averaged per task and then over tasks. The interval is a paired bootstrap "
                      f"over those prompts (stratified by task where every task has {stats.MIN_STRATUM} or more), "
                      "next to an exact sign test of the prompts won against those lost. \"better\" and \"worse\" "
                      "only where the interval excludes zero and the sign test agrees at 5%.", "",
                      markdown(*compared)]
    return parts


class _Files:
    """Writes the report's files; a directory that takes none (read-only, full) costs one warning.

    The report is printed either way, so it is not lost; only the copies on disk are skipped.
    """

    def __init__(self, out: Path):
        self.out = out
        self.failed = False

    def write(self, fn, *args, **kwargs):
        if self.failed:
            return None
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            self.failed = True
            print(f"dapq: warning: cannot write the report's files into {self.out} ({exc.strerror or exc}); "
                  "the report is printed only", file=sys.stderr)
            return None

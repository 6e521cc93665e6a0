"""Pivot the tuning sweeps into one table: method x (task set, length, budget), plus the mean.

    python scripts/tuning-summary.py runs/tune/niah runs/tune/ruler

Scores are averaged over the tasks of a task set at each length (RULER: the 11-task average), then
over samples. The last column is the mean over every (task set, length, budget) column the row has;
a column a row has not finished (fewer cells than FullKV ran there) shows "-".

``niah~`` columns give NIAH partial credit, a tie-breaker when exact match is 0 almost everywhere:
the share of the needle's digits the answer reproduces from its first digit on (a method that
keeps part of the needle recovers its first digits, e.g. 4336 of 4336396 scores 4/7).
"""

from __future__ import annotations

import sys
from collections import defaultdict

from dapq.bench.metrics import digit_prefix_share
from dapq.bench.store import ResultsStore
from dapq.tables import markdown


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python scripts/tuning-summary.py RESULTS_DIR [RESULTS_DIR ...]")
    dirs = argv
    cells: dict[str, dict[tuple, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for d in dirs:
        for r in ResultsStore.open_existing(d):
            col = (r["taskset"], r["meta"].get("length"), r["budget"])
            cells[r["label"]][col][r["task"]].append(r["score"])
            if r["metric"] == "exact_number":
                cells[r["label"]][("niah~", *col[1:])][r["task"]].append(digit_prefix_share(r["prediction"], r["references"]))
    full = cells.pop("full", {})
    columns = sorted({c for row in cells.values() for c in row}, key=lambda c: (c[0], c[1] or 0, c[2] or 0))

    def value(row, col):
        # A column counts only once every (task, sample) FullKV ran is there: an unfinished sweep
        # must not pass a one-task average off as the RULER average.
        tasks = row.get(col)
        ref = full.get((col[0] if col[0] != "niah~" else "niah", col[1], None), {})
        if not tasks or (row is not full and sum(map(len, tasks.values())) < sum(map(len, ref.values()))):
            return None
        return 100 * sum(sum(v) / len(v) for v in tasks.values()) / len(tasks)

    header = ["method"] + [f"{t}-{(n or 0) // 1000}k@{b}" for t, n, b in columns] + ["mean (exact)"]
    full_row = ["full (any budget)"] + [
        f"{v:.1f}" if (v := value(full, (t, n, None))) is not None else "-" for t, n, _ in columns] + [""]
    rows = []
    for label, row in cells.items():
        vals = [value(row, c) for c in columns]
        exact = [v for v, c in zip(vals, columns, strict=True) if v is not None and c[0] != "niah~"]
        mean = sum(exact) / len(exact) if exact else -1.0
        complete = len(exact) == sum(c[0] != "niah~" for c in columns)
        rows.append((mean, [label, *(f"{v:.1f}" if v is not None else "-" for v in vals),
                            f"{mean:.1f}" + ("" if complete else " (of the columns run)")]))
    rows.sort(key=lambda r: -r[0])
    print(markdown(header, [full_row] + [r for _, r in rows]))


if __name__ == "__main__":
    main(sys.argv[1:])

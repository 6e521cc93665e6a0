"""Compare the rows of a context-mode sweep on the samples they share (issue 15).

    python scripts/context-mode-summary.py docs/results/context-mode/niah-4k [...]

`dapq report` averages each row over the samples it finished. In `scripts/context-mode.sh` the
rows ran on different numbers of samples (dapq's methods on more than the kvpress presses, which
cost a prefill each), so a fair comparison restricts every row to the samples all rows have. Each
row gets two columns: the score on those shared samples, and on every sample it has (with their
count). A score is the mean over the row's samples; with the same number of samples per task
that is RULER's 11-task average. ``niah~`` is NIAH partial credit, the share of the needle's
digits reproduced from the first one on (as in ``scripts/tuning-summary.py``).
"""

from __future__ import annotations

import sys
from collections import defaultdict

from dapq.bench.metrics import digit_prefix_share
from dapq.bench.store import ResultsStore
from dapq.tables import markdown


def _size(r: dict) -> tuple[float, str]:
    """(sort value, label): FullKV first, then budgets or ratios in increasing order."""
    if r["budget"] is None and r["keep_fraction"] is None:
        return -1.0, "all"
    return (r["budget"], str(r["budget"])) if r["budget"] is not None else (r["keep_fraction"], f"{r['keep_fraction']:.0%}")


def summarize(path: str) -> str:
    rows: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in ResultsStore.open_existing(path):
        label = r["label"] + (" (kvpress)" if r.get("peer") else "")
        rows[(r.get("compress") or "prompt", _size(r), label)][r["sample_id"]] = r
    shared = set.intersection(*(set(cells) for cells in rows.values()))
    niah = any(r["metric"] == "exact_number" for cells in rows.values() for r in cells.values())

    def mean(cells: dict[str, dict], ids: set[str], partial: bool = False) -> float:
        values = [digit_prefix_share(cells[i]["prediction"], cells[i]["references"]) if partial else cells[i]["score"]
                  for i in ids]
        return 100 * sum(values) / len(values)

    header = ["compress", "size", "method", f"score, shared ({len(shared)})", "score, all (n)"]
    if niah:
        header.append(f"niah~, shared ({len(shared)})")
    table = []
    for (mode, (_, size), label), cells in sorted(rows.items()):
        line = [mode, size, label, f"{mean(cells, shared):.1f}", f"{mean(cells, set(cells)):.1f} ({len(cells)})"]
        if niah:
            line.append(f"{mean(cells, shared, partial=True):.1f}")
        table.append(line)
    return f"## {path}\n\n" + markdown(header, table)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python scripts/context-mode-summary.py RESULTS_DIR [RESULTS_DIR ...]")
    print("\n\n".join(summarize(p) for p in argv))


if __name__ == "__main__":
    main(sys.argv[1:])

"""One table per large set: every row's score with its interval, and its paired differences to
SnapKV and to FullKV (issue 22's "what to report").

    python scripts/large-sets-summary.py docs/results/large-sets/ruler-4k-context [...] > summary.md

Each set's rows come from ``dapq report``'s own tables (:func:`dapq.bench.report.interval_tables`
and :func:`dapq.bench.report.paired_table`), joined on (method, budget, mode), so the figures are
those of ``report.md`` and ``vs-*.md``: nothing is computed here that the report does not compute.
A difference is marked in bold where the report calls it better or worse (its 95% interval
excludes zero and the sign test agrees at 5%).
"""

from __future__ import annotations

import sys

from dapq.bench.report import interval_tables, paired_table, usable
from dapq.bench.store import ResultsStore
from dapq.errors import DapqError
from dapq.tables import markdown


def _differences(records: list[dict], taskset: str, against: str, lead: int) -> dict[tuple, str]:
    """(method, size[, mode]) -> "diff [low, high] (won / lost)", bold where a verdict is given."""
    table = paired_table(records, taskset, against)
    if table is None:
        return {}
    header, rows = table
    ci = header.index("difference, points [95% interval]")
    wlt = header.index("won / lost / tied")
    out = {}
    for row in rows:
        won, lost, _ = (x.strip() for x in row[wlt].split("/"))
        text, verdict = f"{row[ci]} ({won} / {lost})", row[-1]
        out[tuple(row[:lead])] = f"**{text}**, {verdict}" if verdict in ("better", "worse") else text
    return out


def summarize(path: str) -> str:
    """The markdown of one set: a table per task set in its store."""
    records = usable(list(ResultsStore.open_existing(path)), warn=False)
    parts = []
    for taskset in sorted({r["taskset"] for r in records} - {"speed"}):
        (header, rows), _ = interval_tables(records, taskset)
        lead = header.index("tasks")
        vs = {ref: _differences(records, taskset, ref, lead) for ref in ("snapkv", "full")}
        out = []
        for row in rows:
            key = tuple(row[:lead])
            tasks, per_task, score = row[lead], row[lead + 1], row[lead + 2]
            prompts = per_task if tasks == "1" else f"{tasks} x {per_task}"
            out.append([*key, prompts, score, vs["snapkv"].get(key, ""), vs["full"].get(key, "")])
        parts += [
            f"## {path} ({taskset})",
            "",
            markdown(
                [
                    *header[:lead],
                    "prompts",
                    "score [95% interval]",
                    "vs SnapKV, points (won / lost)",
                    "vs FullKV, points (won / lost)",
                ],
                out,
            ),
        ]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python scripts/large-sets-summary.py RESULTS_DIR [RESULTS_DIR ...]", file=sys.stderr)
        return 2
    try:
        print("\n\n".join(summarize(p) for p in argv))
    except DapqError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

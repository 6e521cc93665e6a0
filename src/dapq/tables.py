"""Markdown tables, the one format every report and summary of dapq prints (a leaf module)."""

from __future__ import annotations


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table: a header row, the separator, then one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)

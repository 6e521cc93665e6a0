"""`dapq report` renders paper-style tables and plots from a (partial) results file."""

from __future__ import annotations

import shutil
from pathlib import Path

from dapq.bench.report import length_table, render, table
from dapq.bench.store import ResultsStore

FIX = Path(__file__).parent / "fixtures" / "sweep"


def test_table_layout_and_averages():
    records = list(ResultsStore.open_existing(FIX))
    header, rows = table(records, "niah")
    assert header[:3] == ["method", "budget", "NIAH"] and header[-4:] == ["avg", "% of FullKV", "KV kept", "KV MiB"]
    by = {(r[0], r[1]): r for r in rows}
    assert [r[0] for r in rows][0] == "full"  # FullKV first
    assert by[("full", "all")][2] == "100.0" and by[("full", "all")][-2] == "100.0%"
    assert by[("dapq", "64")][2] == "50.0" and by[("dapq", "64")][-3] == "50.0"  # 50% of FullKV
    assert by[("dapq", "64")][-2] == "6.4%" and by[("dapq", "64")][-1] == "0.0"  # 64 bytes in MiB
    assert by[("snapkv", "64")][2] == "0.0"  # the partial row still renders

    header, rows = table(records, "ruler")
    assert header[2:4] == ["S-NIAH-1", "VT"]  # the paper's task order
    by = {(r[0], r[1]): r for r in rows}
    assert by[("full", "all")][4] == "75.0" and by[("dapq", "128")][4] == "50.0"
    assert by[("dapq", "128")][5] == "66.7"


def test_render_writes_markdown_and_plots(tmp_path):
    shutil.copy(FIX / "results.jsonl", tmp_path / "results.jsonl")
    text = render(tmp_path)
    assert "## niah" in text and "## ruler" in text
    assert (tmp_path / "report.md").read_text() == text
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert "niah-budget.png" in pngs and "ruler-budget.png" in pngs
    assert "niah-heatmap-dapq-64.png" in pngs and "niah-heatmap-full-all.png" in pngs
    assert all((tmp_path / p).stat().st_size > 1000 for p in pngs)


def test_longbench_v2_split_columns():
    def rec(label, budget, sid, score, splits):
        return {"key": f"{label}{budget}{sid}", "taskset": "longbench-v2", "task": "longbench-v2", "label": label,
                "budget": budget, "score": score, "kv_bytes_full": 10, "kv_bytes_kept": 10, "sample_id": sid,
                "meta": {"splits": splits}}

    records = [rec("full", None, "a", 1.0, ["easy", "short"]), rec("full", None, "b", 0.0, ["hard", "long"])]
    header, rows = table(records, "longbench-v2")
    assert header[2:7] == ["longbench-v2", "longbench-v2:easy", "longbench-v2:hard", "longbench-v2:long",
                           "longbench-v2:short"]
    assert rows[0][2:7] == ["50.0", "100.0", "0.0", "0.0", "100.0"]
    assert rows[0][7] == "50.0"  # the average counts the overall column only, not the splits


def test_length_table_averages_tasks_per_length():
    def rec(label, budget, task, length, score):
        return {"key": f"{label}{budget}{task}{length}", "taskset": "ruler", "task": task, "label": label,
                "budget": budget, "score": score, "kv_bytes_full": 10, "kv_bytes_kept": 10,
                "meta": {"length": length}}

    records = [rec("full", None, "vt", 2000, 1.0), rec("full", None, "cwe", 2000, 0.5),
               rec("full", None, "vt", 4000, 0.0), rec("dapq", 64, "vt", 2000, 1.0)]
    header, rows = length_table(records, "ruler")
    assert header == ["method", "budget", "2000 tok", "4000 tok", "avg"]
    assert rows[0] == ["full", "all", "75.0", "0.0", "37.5"]
    assert rows[1] == ["dapq", "64", "100.0", "-", "100.0"]
    assert length_table(records[:2], "ruler") is None  # one length: nothing to split

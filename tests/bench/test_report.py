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

    records = [rec("full", None, "a", 1.0, ["easy", "short"]), rec("full", None, "b", 0.0, ["hard", "long"]),
               rec("full", None, "c", 1.0, ["hard", "medium"])]
    header, rows = table(records, "longbench-v2")
    # result.py's columns, in its order.
    assert header[2:8] == ["Overall", "Easy", "Hard", "Short", "Medium", "Long"]
    assert rows[0][2:8] == ["66.7", "100.0", "50.0", "100.0", "100.0", "0.0"]
    assert rows[0][8] == "66.7"  # the average counts the overall column only, not the splits


def _rec(taskset, task, label, budget, sid, score):
    return {"key": f"{task}{label}{budget}{sid}", "taskset": taskset, "task": task, "label": label, "budget": budget,
            "score": score, "kv_bytes_full": 10, "kv_bytes_kept": 10, "sample_id": sid, "meta": {}}


def test_longbench_task_scores_are_rounded_to_two_decimals():
    # eval.py: round(100 * mean, 2); 1/3 -> 33.33, and 0.123456 -> 12.35 (one decimal would show 12.3).
    records = [_rec("longbench", "trec", "full", None, str(i), s) for i, s in enumerate((1.0, 0.0, 0.0))]
    records += [_rec("longbench", "qasper", "full", None, "q", 0.123456)]
    header, rows = table(records, "longbench")
    assert header[2:4] == ["qasper", "trec"]  # Table 2's order
    assert rows[0][2:5] == ["12.35", "33.33", "22.84"]


def test_helmet_columns_are_table_14():
    tasks = ["kilt_triviaqa", "icl_nlu", "narrativeqa", "icl_banking77", "kilt_nq", "infbench_qa_eng", "icl_clinic150",
             "kilt_popqa_3", "icl_trec_fine", "kilt_hotpotqa", "icl_trec_coarse"]
    records = [_rec("helmet", t, "full", None, "0", 1.0 if t.startswith("icl") else 0.5) for t in tasks]
    header, rows = table(records, "helmet")
    assert header[2:14] == ["icl_banking77", "icl_clinic150", "icl_nlu", "icl_trec_coarse", "icl_trec_fine",
                            "narrativeqa", "infbench_qa_eng", "kilt_hotpotqa", "kilt_nq", "kilt_popqa_3",
                            "kilt_triviaqa", "avg"]
    assert rows[0][13] == f"{100 * (5 + 6 * 0.5) / 11:.1f}"


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


def _row_rec(label, score, *, budget=None, keep_fraction=None, compress="prompt", peer=None, kept=1, sid="s"):
    return {"key": f"{label}{budget}{keep_fraction}{compress}{sid}", "taskset": "ruler", "task": "vt", "label": label,
            "budget": budget, "keep_fraction": keep_fraction, "compress": compress, "peer": peer, "score": score,
            "kv_bytes_kept": kept, "kv_bytes_full": 4, "meta": {}, "config": {"kvpress_version": "0.5.5"}}


def test_modes_ratios_and_peers_get_their_own_rows(tmp_path):
    records = [
        _row_rec("full", 1.0, kept=4), _row_rec("full", 0.5, compress="context", kept=4),
        _row_rec("dapq", 0.5, budget=64), _row_rec("dapq", 0.25, budget=64, compress="context"),
        _row_rec("dapq", 0.5, keep_fraction=0.25, compress="context"),
        _row_rec("kvpress:SnapKVPress", 0.4, keep_fraction=0.25, compress="context", peer="kvpress"),
    ]
    header, rows = table(records, "ruler")
    assert header[:4] == ["method", "budget", "compress", "VT"]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("full", "all", "prompt"), ("dapq", "64", "prompt"),
        ("full", "all", "context"), ("dapq", "64", "context"), ("dapq", "25%", "context"),
        ("kvpress:SnapKVPress (kvpress peer)", "25%", "context"),
    ]
    rel = {(r[0], r[1], r[2]): r[-3] for r in rows}
    # % of FullKV against FullKV of the same mode: 0.25 / 0.5 in context mode, 0.5 / 1.0 in prompt mode.
    assert rel[("dapq", "64", "context")] == "50.0" and rel[("dapq", "64", "prompt")] == "50.0"
    assert rel[("kvpress:SnapKVPress (kvpress peer)", "25%", "context")] == "80.0"
    shutil.copy(FIX / "results.jsonl", tmp_path / "results.jsonl")
    with ResultsStore(tmp_path) as store:
        for r in records:
            store.append({**r, "taskset": "niah", "task": "niah", "meta": {"length": 100, "depth": 0.5}})
    text = render(tmp_path)
    assert "(kvpress peer) ran through kvpress 0.5.5's own pipeline" in text and "compress = context" in text
    assert (tmp_path / "niah-keep_fraction.png").exists() and (tmp_path / "niah-heatmap-dapq-25_-context.png").exists()


def test_a_table_without_context_cells_has_no_mode_column():
    header, _ = table([_row_rec("full", 1.0), _row_rec("dapq", 0.5, budget=64)], "ruler")
    assert header[:3] == ["method", "budget", "VT"]


def test_rows_that_mix_configurations_are_shown_apart(capsys):
    from dapq.bench.report import usable

    def rec(sid, score, **config):
        return {**_rec("ruler", "vt", "dapq", None, sid, score), "config": {"method": "dapq", **config}}

    # A store resumed after the default changed: position_offset 0 then 64, under one label. The
    # first record also predates the field `kernel` (added later, its default the old behaviour).
    records = [rec("a", 1.0, position_offset=0), rec("b", 1.0, position_offset=0, kernel=7),
               rec("c", 0.0, position_offset=64),  # the newest config without `kernel`: the same row
               rec("a", 0.0, position_offset=64, kernel=7), rec("b", 0.0, position_offset=64, kernel=7),
               {**rec("a", 0.5, compression_ratio=0.7), "label": "kvpress:SnapKVPress", "peer": "kvpress"},
               {**rec("b", 0.5, compression_ratio=0.8), "label": "kvpress:SnapKVPress", "peer": "kvpress"}]
    header, rows = table(usable(records), "ruler")
    by = {r[0]: r for r in rows}
    # Pooled, the row would read 50.0; apart, each configuration keeps its own score.
    assert by["dapq"][2] == "0.0" and by["dapq[position_offset=0]"][2] == "100.0" and len(rows) == 3
    assert by["kvpress:SnapKVPress (kvpress peer)"][2] == "50.0"  # per-prompt config fields split nothing
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mix method configurations" in err and "dapq[position_offset=0]" in err
    assert usable(records[2:]) == records[2:] and not capsys.readouterr().err  # one configuration: unchanged
    assert [r["sample_id"] for r in usable(records, warn=False) if r["label"] == "dapq"] == ["c", "a", "b"]

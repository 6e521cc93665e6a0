"""Old results files under today's names: every method of a file written before the rename."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapq.methods import build
from dapq.methods.legacy import legacy_config, upgrade_config, upgrade_label, upgrade_record

OLD = Path(__file__).parents[1] / "bench" / "fixtures" / "legacy-v1" / "results.jsonl"
RECORDS = [json.loads(line) for line in OLD.read_text().splitlines()[1:]]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{r['label']}-{r['budget']}-{r.get('compress')}")
def test_old_configs_round_trip_through_todays_methods(record):
    """Upgraded, built and recorded again, an old configuration comes back exactly as it was."""
    old = record["config"]
    new = upgrade_config(old)
    assert "ratio" not in new and "keep_fraction" in new
    method = build(new["method"], **{k: v for k, v in new.items() if k != "method"})
    assert method.config() == new
    assert legacy_config(method.config()) == old


def test_renames_reach_labels_and_records():
    assert upgrade_label("dapq(window=16)", "dapq") == "dapq(n_pseudo=16)"
    # The hybrid's two renames happen at once: its old window was N, its old prompt_window is today's window.
    assert upgrade_label("dapq_hybrid(prompt_window=4, window=8)", "dapq_hybrid") == \
        "dapq_hybrid(window=4, n_pseudo=8)"
    assert upgrade_label("snapkv(window=4)", "snapkv") == "snapkv(window=4)"
    old = next(r for r in RECORDS if r["label"] == "lacache(recent_tokens=8)")
    new = upgrade_record(old)
    assert new["label"] == "lacache(keep_recent=8)" and new["config"]["keep_recent"] == 8
    assert "ratio" not in new and new["keep_fraction"] == old["ratio"]
    assert upgrade_record(new) == new  # today's records pass unchanged


def test_settings_old_files_cannot_hold_have_no_legacy_config():
    assert legacy_config(build("snapkv", budget=8, layer_budget="pyramid").config()) is None
    assert legacy_config(build("pyramidkv", budget=8, layer_budget="flat").config()) is None
    assert legacy_config(build("pyramidkv", budget=8, pyramid_beta=10).config())["beta"] == 10

"""Method configurations as results files written before the one-name-per-idea rename recorded them.

dapq 0.1's first results files (store format 1, before the method contract of issue 19) named
some parameters differently: DapQ's N pseudo tokens and the oracle's T steps were ``window``, the
kept fraction was ``ratio`` (which kvpress calls the *removed* fraction), H2O's and LaCache's
always-kept tail were ``window`` and ``recent_tokens``, PyramidKV's steepness was ``beta``. Those
files must still resume and report, so:

- :func:`upgrade_config` / :func:`upgrade_record` read an old configuration or record under
  today's names (the store does this as it loads);
- :func:`legacy_config` gives the old configuration of a method today, so that the runner can
  find a cell an old file already holds under its old key.

A configuration is old when it has a ``ratio`` entry: every method's configuration had one, and
today's have ``keep_fraction`` instead.
"""

from __future__ import annotations

import re

#: Old name -> today's name, per method (``*``: every method and kvpress peer).
RENAMED: dict[str, dict[str, str]] = {
    "*": {"ratio": "keep_fraction"},
    "dapq": {"window": "n_pseudo"},
    "dapq_hybrid": {"window": "n_pseudo", "prompt_window": "window"},
    "deferkv": {"prompt_window": "window"},
    "h2o": {"window": "keep_recent"},
    "lacache": {"recent_tokens": "keep_recent"},
    "oracle": {"window": "steps"},
    "pyramidkv": {"beta": "pyramid_beta"},
}

#: Parameters every method gained in the redesign, with the value that does what old files did.
#: (DapQ and its hybrid had ``layer_budget`` already; PyramidKV's schedule was always the pyramid.)
ADDED: dict[str, dict[str, object]] = {
    "*": {"layer_budget": "flat", "pyramid_beta": 20},
    "dapq": {"pyramid_beta": 20},
    "dapq_hybrid": {"pyramid_beta": 20},
    "pyramidkv": {"layer_budget": "pyramid"},
}

_PEER = "kvpress:"


def _renames(method: str) -> dict[str, str]:
    return {**RENAMED["*"], **RENAMED.get(method, {})}


def _added(method: str) -> dict[str, object]:
    if method.startswith(_PEER):
        return {}
    return ADDED.get(method, ADDED["*"])


def is_legacy(config: dict) -> bool:
    """True for a configuration recorded under the old names."""
    return "ratio" in config


def upgrade_config(config: dict) -> dict:
    """An old configuration under today's names, with the added parameters at their old behaviour."""
    if not is_legacy(config):
        return config
    names = _renames(str(config.get("method", "")))
    out = {names.get(k, k): v for k, v in config.items()}
    return {**out, **{k: v for k, v in _added(str(config.get("method", ""))).items() if k not in out}}


def legacy_config(config: dict) -> dict | None:
    """Today's configuration as an old file recorded it, or None if old files cannot hold it."""
    method = str(config.get("method", ""))
    added = _added(method)
    if any(config.get(k, v) != v for k, v in added.items()):
        return None  # a setting that did not exist then (say a pyramid schedule for SnapKV)
    back = {new: old for old, new in _renames(method).items()}
    return {back.get(k, k): v for k, v in config.items() if k not in added}


def upgrade_label(label: str, method: str) -> str:
    """``dapq(window=16)`` -> ``dapq(n_pseudo=16)``: a label's parameters under today's names."""
    names = RENAMED.get(method, {})
    if "(" not in label or not names:
        return label
    return re.sub(r"([(,]\s*)([a-z_]+)(\s*=)", lambda m: m.group(1) + names.get(m.group(2), m.group(2)) + m.group(3),
                  label)


def upgrade_record(record: dict) -> dict:
    """A results record under today's names (records of today are returned as they are)."""
    config = record.get("config")
    if not isinstance(config, dict) or not is_legacy(config):
        return record
    out = {("keep_fraction" if k == "ratio" else k): v for k, v in record.items()}
    out["config"] = upgrade_config(config)
    if isinstance(out.get("label"), str):
        out["label"] = upgrade_label(out["label"], str(config.get("method", "")))
    return out

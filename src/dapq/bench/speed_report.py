"""Tables of ``dapq bench speed`` records: throughput, TTFT, memory, and the kvpress comparison.

Ratios compare cells of the same session (one invocation) whenever one exists; a ratio taken
across sessions is marked ``*`` because this machine's speed drifts between runs. TTFT cells of
one session were timed in turns (sample ``i`` of every method comes from round ``i``), so their
ratio is the median of the per-round ratios: drift between rounds cancels out of each of them,
where a ratio of two medians still carries it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from ..tables import markdown

MIB = 2**20
# dapq methods and the kvpress press that implements the same idea.
PEER_OF = {"snapkv": "kvpress-snapkv", "streamingllm": "kvpress-streamingllm", "dapq": "kvpress-snapkv"}


def _med(value) -> float | None:
    return value["median"] if isinstance(value, dict) else value


def _setting(r: dict) -> tuple:
    return r["model"], r["device"], r["dtype"], r["cell"], r.get("context"), r.get("batch")


class _Index:
    """Speed records by (setting, label), newest last; lookups prefer a given session."""

    def __init__(self, records: list[dict]):
        self.by: dict[tuple, list[dict]] = defaultdict(list)
        for r in records:
            if r.get("analysis") == "speed" and r.get("label") and (r.get("oom") or not r.get("error")):
                self.by[(*_setting(r), r["label"])].append(r)

    def get(self, setting: tuple, label: str, session: str | None = None) -> tuple[dict | None, bool]:
        """(record, same_session)."""
        rs = self.by.get((*setting, label), [])
        same = [r for r in rs if r.get("session") == session]
        if same:
            return same[-1], True
        return (rs[-1], False) if rs else (None, False)

    def labels(self, cell: str) -> list[tuple[str, int | None]]:
        seen = {(k[-1], rs[-1].get("budget")) for k, rs in self.by.items() if k[3] == cell}
        return sorted(seen, key=lambda x: (x[0] != "full", x[0].startswith("kvpress"), x[1] or 0, x[0]))

    def values(self, cell: str, index: int) -> list:
        return sorted({k[index] for k in self.by if k[3] == cell and k[index] is not None})

    def settings(self, cell: str) -> list[tuple]:
        return sorted({k[:4] for k in self.by if k[3] == cell}, key=str)


def turn_ratio(value: dict | float, ref: dict | float) -> float:
    """``value / ref`` for two timings of one round-robin run: the median of the per-round ratios
    when both hold one sample per round, else the ratio of the medians."""
    a, b = (v.get("samples") if isinstance(v, dict) else None for v in (value, ref))
    if a and b and len(a) == len(b):
        return statistics.median(x / y for x, y in zip(a, b, strict=True))
    return _med(value) / _med(ref)


def _ratio(value: float | None, ref: float | None, same: bool) -> str:
    if value is None or not ref:
        return ""
    return f" ({value / ref:.2f}x{'' if same else '*'})"


def throughput_table(index: _Index, setting: tuple) -> tuple[list[str], list[list[str]]]:
    """Decode tokens/s by batch size, ratio to FullKV at the same batch, and the share of the
    memory-bandwidth bound (weights + KV bytes a step must read, over the device's measured copy
    bandwidth)."""
    model, device, dtype, _ = setting
    contexts = index.values("decode", 4)
    batches = index.values("decode", 5)
    header = ["method", "budget", "context"] + [f"B={b}" for b in batches]
    rows = []
    for context in contexts:
        for label, budget in index.labels("decode"):
            cells = []
            for b in batches:
                r, _ = index.get((model, device, dtype, "decode", context, b), label)
                if r is None:
                    cells.append("-")
                elif r.get("oom"):
                    cells.append("OOM" + (" (predicted)" if r.get("predicted") else ""))
                else:
                    full, same = index.get((model, device, dtype, "decode", context, b), "full", r.get("session"))
                    ref = None if full is None or full.get("oom") else full["tokens_per_s"]
                    bound = r.get("bound_tokens_per_s")
                    share = f" [{100 * r['tokens_per_s'] / bound:.0f}% of bound]" if bound else ""
                    cells.append(f"{r['tokens_per_s']:.1f}{_ratio(r['tokens_per_s'], ref, same) if label != 'full' else ''}"
                                 f"{share}")
            if any(c != "-" for c in cells):
                rows.append([label, str(budget or "all"), str(context), *cells])
        for peer in sorted({k[-1] for k in index.by if k[3] == "peer" and k[4] == context}):
            r, _ = index.get((model, device, dtype, "peer", context, 1), peer)
            if r is not None and r.get("tokens_per_s"):
                rate = f"{r['tokens_per_s']:.1f}"
                rows.append([peer, str(r.get("budget")), str(context), rate, *["(no batching)"] * (len(batches) - 1)])
    return header, rows


def ttft_table(index: _Index, setting: tuple) -> tuple[list[str], list[list[str]]]:
    """Prefill + compress seconds by context length (ratio to FullKV), and the compression share."""
    model, device, dtype, _ = setting
    lengths = index.values("ttft", 4)
    header = ["method", "budget"] + [f"{n} tok" for n in lengths] + [f"compress % @{n}" for n in lengths]
    rows = []
    for label, budget in index.labels("ttft"):
        times, shares = [], []
        for n in lengths:
            r, _ = index.get((model, device, dtype, "ttft", n, 1), label)
            if r is None or r.get("oom"):
                times.append("-" if r is None else "OOM")
                shares.append("-")
                continue
            full, same = index.get((model, device, dtype, "ttft", n, 1), "full", r.get("session"))
            t = _med(r["ttft_s"])
            ref = None if full is None or full.get("oom") else _med(full["ttft_s"])
            if label != "full" and ref and same:
                t_ratio = turn_ratio(r["ttft_s"], full["ttft_s"])
                times.append(f"{t:.3f} ({t_ratio:.3f}x)")
            else:
                times.append(f"{t:.3f}{_ratio(t, ref, same) if label != 'full' else ''}")
            forward = _med(r["forward_s"])
            shares.append(f"{100 * _med(r['compress_s']) / forward:.2f}" if forward else "-")
        rows.append([label, str(budget or "all"), *times, *shares])
    return header, rows


def memory_table(index: _Index, setting: tuple) -> tuple[list[str], list[list[str]]]:
    """Peak memory and KV MiB held during decoding, by batch; KV kept vs the budget/Lp rule."""
    model, device, dtype, _ = setting
    batches = index.values("decode", 5)
    what = "peak RSS" if device.startswith("cpu") else "peak allocated"
    header = ["method", "budget", "KV kept / full", "budget / Lp"] + [f"B={b} {what} / KV MiB" for b in batches]
    rows = []
    for context in index.values("decode", 4):
        for label, budget in index.labels("decode"):
            cells, share = [], "-"
            for b in batches:
                r, _ = index.get((model, device, dtype, "decode", context, b), label)
                if r is None:
                    cells.append("-")
                elif r.get("oom"):
                    cells.append("OOM")
                else:
                    cells.append(f"{r['peak_bytes'] / MIB:.0f} / {r['kv_bytes_kept'] / MIB:.1f}")
                    share = f"{r['kv_bytes_kept'] / r['kv_bytes_full']:.4f}"
            expected = f"{min(budget, context) / context:.4f}" if budget else "1.0000"
            if any(c != "-" for c in cells):
                rows.append([label, str(budget or "all"), share, expected, *cells])
    return header, rows


def peer_table(index: _Index, setting: tuple) -> tuple[list[str], list[list[str]]]:
    """dapq vs kvpress at batch 1: end to end, TTFT, decode speed; and batched dapq vs kvpress."""
    model, device, dtype, _ = setting
    header = ["dapq method", "kvpress press", "context", "dapq e2e s", "kvpress e2e s", "e2e ratio",
              "dapq TTFT s", "kvpress TTFT s", "TTFT ratio", "decode tok/s ratio (B=1)", "best batched ratio"]
    rows = []
    for context in index.values("peer", 4):
        for label, peer in PEER_OF.items():
            p, _ = index.get((model, device, dtype, "peer", context, 1), peer)
            d, same = index.get((model, device, dtype, "e2e", context, 1), label, p and p.get("session"))
            if p is None or d is None:
                continue
            t, _ = index.get((model, device, dtype, "ttft", context, 1), label, p.get("session"))
            dec1, _ = index.get((model, device, dtype, "decode", context, 1), label, p.get("session"))
            star = "" if same else "*"
            de, pe = _med(d["e2e_s"]), _med(p["e2e_s"])
            pt = _med(p["ttft_s"])
            dt = _med(t["ttft_s"]) if t and not t.get("oom") else None
            best = ""
            decoded = [r for b in index.values("decode", 5)
                       if (r := index.get((model, device, dtype, "decode", context, b), label)[0]) and not r.get("oom")]
            if decoded and p.get("tokens_per_s"):
                top = max(decoded, key=lambda r: r["tokens_per_s"])
                best = f"{top['tokens_per_s'] / p['tokens_per_s']:.1f}x at B={top['batch']}"
            rows.append([
                label, peer, str(context), f"{de:.3f}", f"{pe:.3f}", f"{de / pe:.3f}{star}",
                f"{dt:.3f}" if dt else "-", f"{pt:.3f}", f"{dt / pt:.3f}" if dt else "-",
                f"{dec1['tokens_per_s'] / p['tokens_per_s']:.2f}" if dec1 and not dec1.get("oom") else "-",
                best,
            ])
    return header, rows


def peer_cost_table(index: _Index, setting: tuple) -> tuple[list[str], list[list[str]]]:
    """Each kvpress press's context prefill against kvpress's pipeline without a press (same child, same rounds)."""
    model, device, dtype, _ = setting
    header = ["kvpress press", "context", "prefill under the press s", "prefill without a press s",
              "compression cost, % of the prefill"]
    rows = []
    for context in index.values("peer", 4):
        base, _ = index.get((model, device, dtype, "peer", context, 1), "kvpress-none")
        for peer in sorted({k[-1] for k in index.by if k[3] == "peer" and k[4] == context} - {"kvpress-none"}):
            r, _ = index.get((model, device, dtype, "peer", context, 1), peer)
            if r is None or base is None or r.get("prefill_ratio_to_no_press") is None:
                continue
            rows.append([peer, str(context), f"{_med(r['forward_s']):.3f}", f"{_med(base['forward_s']):.3f}",
                         f"{100 * (r['prefill_ratio_to_no_press'] - 1):.1f}"])
    return header, rows


def errors(records: list[dict]) -> list[str]:
    return [f"- {r.get('label')}: {r['error']}" for r in records if r.get("analysis") == "speed" and r.get("error")
            and not r.get("oom")]


def render_speed(records: list[dict]) -> str:
    """Markdown sections for every (model, device, dtype) that has speed records."""
    index = _Index(records)
    parts = []
    settings = sorted({s[:3] for cell in ("ttft", "decode", "e2e", "peer") for s in index.settings(cell)}, key=str)
    for model, device, dtype in settings:
        setting = (model, device, dtype, None)
        parts += [f"### speed: {model} on {device}, {dtype}", ""]
        for title, fn in (("Decode throughput (tokens/s) vs batch size, ratio to FullKV", throughput_table),
                          ("TTFT: prefill + compress seconds vs context length, ratio to FullKV", ttft_table),
                          ("Memory during decoding vs batch size", memory_table),
                          ("dapq vs kvpress (same prompt, same model, same run)", peer_table),
                          ("kvpress's compression cost: prefill under each press vs no press (median of "
                           "per-round ratios)", peer_cost_table)):
            header, rows = fn(index, setting)
            if rows:
                parts += [f"#### {title}", "", markdown(header, rows), ""]
    problems = errors(records)
    if problems:
        parts += ["Cells that failed:", *problems, ""]
    if any("*" in p for p in parts):
        parts.append("`*`: ratio across runs (no FullKV cell in the same session).")
    return "\n".join(parts)

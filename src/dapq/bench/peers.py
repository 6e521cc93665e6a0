"""The kvpress peer row of ``dapq bench speed``: the real kvpress pipeline, timed in a child process.

kvpress (NVIDIA, ``kvpress==0.5.5``, extra ``dapq[peers]``) is run, never re-implemented. The
child process exists because ``import kvpress`` wraps transformers' attention functions
process-wide; dapq's own cells must not run through that wrapper.

What is timed. kvpress's pipeline (``KVPressTextGenerationPipeline._forward``) prefills the context
under the press (calling the base model, no LM head), runs the question tokens, then greedy
decodes one token per forward. The prompt is split so that the total input equals dapq's: context
= the prompt minus its last token, question = the last token. So the question forward yields the
first new token exactly like dapq's prefill logits at Lp-1, and ``T`` new tokens cost one prefill,
one question forward and ``T - 1`` decode steps on both sides. Forward hooks on the base model
timestamp each of those calls; the end-to-end time is the wall time of the whole pipeline call, and a
decode step is the time from one base-model call to the next (forward, LM head and argmax, the
same span as a step of dapq's decode cells).
End-of-sequence is disabled for the run so every repeat decodes all ``T`` tokens.

The pipeline has no batching: it serves one context at a time, so its throughput at batch ``B``
is its batch-1 throughput.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from ..errors import DapqError

PRESSES = {"snapkv": "SnapKVPress", "streamingllm": "StreamingLLMPress"}


def press_kwargs(name: str, budget: int, context_len: int) -> dict:
    """kvpress arguments that keep exactly ``budget`` context tokens, dapq's defaults otherwise.

    kvpress keeps ``int(n * (1 - compression_ratio))`` tokens; aiming half a token above
    ``budget`` makes float rounding land on ``budget``.
    """
    ratio = 1.0 - (budget + 0.5) / context_len
    if ratio <= 0:
        raise DapqError(f"budget {budget} keeps the whole {context_len}-token context; nothing to compress")
    if name == "snapkv":
        return {"compression_ratio": ratio, "window_size": 8, "kernel_size": 7}  # dapq's SnapKV settings
    if name == "streamingllm":
        return {"compression_ratio": ratio, "n_sink": 4}
    raise DapqError(f"no kvpress peer for {name!r}; choose from {', '.join(PRESSES)}")


def run_kvpress(spec: dict, *, timeout: float = 3600) -> list[dict]:
    """Run the peer in a child process; ``spec`` is what :func:`child` reads (see there).

    Returns one record per press. A missing or failing kvpress becomes one record with an
    ``error``, so the benchmark carries on.
    """
    try:
        proc = subprocess.run([sys.executable, "-m", "dapq.bench.peers"], input=json.dumps(spec),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [{"label": "kvpress", "error": f"timed out after {timeout:.0f} s"}]
    rows = [_summarise(json.loads(line)) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 and not any("error" in r for r in rows):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        rows.append({"label": "kvpress", "error": f"exit code {proc.returncode}: {last[:300]}"})
    return rows


def _summarise(row: dict) -> dict:
    """Medians and spreads of the child's raw runs, in the same shape as dapq's cells."""
    from .speed import Timing

    runs = row.pop("runs", None)
    if not runs:
        return row
    steps = [r["decode_steps_s"] for r in runs]
    rates = Timing([len(s) / sum(s) for s in steps if s])
    row.update(
        e2e_s=Timing([r["e2e_s"] for r in runs]).to_dict(),
        ttft_s=Timing([r["first_token_s"] for r in runs]).to_dict(),
        forward_s=Timing([r["prefill_s"] for r in runs]).to_dict(),
        tokens_per_s=rates.median,
        tokens_per_s_spread=list(rates.spread),
        runs=runs,
    )
    return row


def _load(spec: dict):
    import torch

    from ..models import load_model, placeholder_tokenizer, random_model

    torch.set_num_threads(spec["threads"])
    if spec.get("random_weights"):
        model = random_model(spec["random_weights"], dtype=spec["dtype"], device=spec["device"],
                             attn_implementation=spec["attn"], seed=spec.get("seed", 0))
        tokenizer = placeholder_tokenizer()
    else:
        model, tokenizer = load_model(spec.get("model"), dtype=spec["dtype"], device=spec["device"],
                                      attn_implementation=spec["attn"])
    return model, tokenizer


def _time_press(pipe, model, press, ids, steps: int, repeats: int, warmup: int) -> dict:
    import torch

    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    stamps: list[float] = []

    def stamp(*_):
        sync()
        stamps.append(time.perf_counter())

    base = model.get_decoder()
    hooks = [base.register_forward_pre_hook(stamp), base.register_forward_hook(stamp)]
    context = torch.tensor([ids[:-1]], device=model.device)
    question = torch.tensor([ids[-1:]], device=model.device)
    runs = []
    try:
        for i in range(warmup + repeats):
            stamps.clear()
            sync()
            start = time.perf_counter()
            with torch.no_grad():
                pipe._forward({"context_ids": context, "questions_ids": [question]}, max_new_tokens=steps, press=press)
            sync()
            total = time.perf_counter() - start
            calls = [(stamps[j], stamps[j + 1]) for j in range(0, len(stamps) - 1, 2)]
            # A decode step runs from one base-model call to the next: the forward, the LM head and
            # the argmax, as in dapq's decode cells; the last one ends with the pipeline call.
            starts = [a for a, _ in calls[2:]] + [start + total]
            if i >= warmup:
                runs.append({"e2e_s": total, "prefill_s": calls[0][1] - calls[0][0],
                             "first_token_s": calls[1][1] - start,
                             "decode_steps_s": [b - a for a, b in zip(starts, starts[1:], strict=False)]})
    finally:
        for h in hooks:
            h.remove()
    return runs


def child() -> int:
    """Read a JSON spec on stdin, print one JSON record per press on stdout.

    Spec: ``model`` or ``random_weights``, ``dtype``, ``device``, ``attn``, ``threads``,
    ``ids`` (the prompt token ids), ``budget``, ``presses``, ``decode_tokens``, ``repeats``,
    ``warmup``.
    """
    from importlib.metadata import version

    spec = json.loads(sys.stdin.read())
    try:
        import kvpress
        from kvpress.pipeline import KVPressTextGenerationPipeline
    except ImportError:
        print(json.dumps({"label": "kvpress", "error": "kvpress is not installed (pip install 'dapq[peers]')"}))
        return 3
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model, tokenizer = _load(spec)
    model.generation_config.eos_token_id = None  # kvpress stops at EOS; every repeat decodes T tokens
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
    ids = spec["ids"]
    for name in spec["presses"]:
        kwargs = press_kwargs(name, spec["budget"], len(ids) - 1)
        press = getattr(kvpress, PRESSES[name])(**kwargs)
        runs = _time_press(pipe, model, press, ids, spec["decode_tokens"], spec["repeats"], spec["warmup"])
        print(json.dumps({"label": f"kvpress-{name}", "press": PRESSES[name], "press_kwargs": kwargs,
                          "kvpress_version": version("kvpress"), "runs": runs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(child())

"""Independent references the tests compare the library against."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys

import pytest
import torch
from transformers import DynamicCache

from dapq import compat
from dapq.cache import CompressedCache
from dapq.compress import make_batch, prefill
from dapq.decoding import DecodeStepper


@torch.no_grad()
def masked_reference_logits(model, prompt: list[int], cache: CompressedCache, tokens: list[int],
                            question: list[int] = ()) -> torch.Tensor:
    """Decode ``tokens`` over the *full* prompt cache, masking out every evicted key per head.

    This never touches the compressed cache's tensors: it only reads which prompt columns each
    (layer, KV head) kept, and builds an additive per-head mask for an eager full-cache decode.
    With a ``question``, its tokens are first fed in one forward after the prompt (causal among
    themselves, over the kept prompt keys): context-only compression. Returns the logits after
    the question (if any) and after each token.
    """
    assert model.config._attn_implementation == "eager"
    lp, n_q = len(prompt), len(question)
    full = DynamicCache()
    compat.forward(model, torch.tensor([prompt]), position_ids=torch.arange(lp)[None], cache=full, first_column=0)
    n_heads, n_kv = model.config.num_attention_heads, model.config.num_key_value_heads
    keep = []
    for layer in cache.layers:
        k = torch.zeros(n_kv, lp, dtype=torch.bool)
        if layer.kept_indices is None:
            k[:] = True
        else:
            idx = layer.kept_indices[0]  # (Hkv, C); a single prompt has no padding slots...
            # ...but a head-wise layer masks each head's first slots (its count is below C).
            real = torch.arange(idx.shape[-1]) >= layer.pad_slots[0].reshape(-1, 1)
            k.scatter_(1, idx, real.expand_as(idx))
        keep.append(k.repeat_interleave(n_heads // n_kv, dim=0))  # (Hq, Lp)
    state = {"new": 0, "queries": 1}

    def pre_hook(module, args, kwargs):
        seen, n = state["new"], state["queries"]
        prompt_keep = keep[module.layer_idx][:, None, :].expand(-1, n, -1)  # (Hq, n, Lp)
        # New columns: query i sees the ``seen`` earlier new tokens and itself.
        new = torch.arange(seen + n)[None, :] <= (seen + torch.arange(n))[:, None]
        allowed = torch.cat([prompt_keep, new[None].expand(n_heads, -1, -1)], dim=-1)
        kwargs["attention_mask"] = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[None]
        return args, kwargs

    handles = [layer.self_attn.register_forward_pre_hook(pre_hook, with_kwargs=True) for layer in model.model.layers]
    out = []
    try:
        for block in ([list(question)] if n_q else []) + [[tok] for tok in tokens]:
            state["queries"] = len(block)
            start = lp + state["new"]
            positions = torch.arange(start, start + len(block))[None]
            logits = compat.forward(model, torch.tensor([block]), position_ids=positions, cache=full,
                                    first_column=start).logits[0, -1]
            out.append(logits)
            state["new"] += len(block)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(out)


@torch.no_grad()
def compressed_logits(model, state, tokens: list[int]) -> torch.Tensor:
    """Teacher-forced decode of ``tokens`` over a single-prompt compressed cache."""
    with DecodeStepper(model, state, len(tokens)) as step:
        return torch.stack([step(torch.tensor([tok]))[0] for tok in tokens])


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Plain transformers greedy decoding, no dapq involved."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0, min_new_tokens=n)
    return out[0, len(prompt):].tolist()


def import_kvpress():
    """kvpress, or a skip that prints why: kvpress 0.5.5 installs only next to transformers < 5.3."""
    import transformers

    return pytest.importorskip(
        "kvpress", reason=f"kvpress is not installed: kvpress 0.5.5 needs transformers<5.3 and this environment has "
                          f"{transformers.__version__} (the pinned environment of `make test` runs these tests)")


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """Run ``dapq ARGS`` in-process: (exit code, stdout, stderr)."""
    from dapq.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
        raise SystemExit(0)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def save_tiny(path, tokenizer, **overrides) -> str:
    """Save a tiny random Llama and the test tokenizer as a model directory."""
    from conftest import tiny_model

    tiny_model("llama", **overrides).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@contextlib.contextmanager
def lock_held_by_another_process(setup: str, path):
    """A second Python process runs ``setup`` (which takes a lock on ``sys.argv[1]``) and holds it.

    On exit the process is killed with SIGKILL, as a crashed run would be: the kernel drops its lock.
    """
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys, time\n{setup}\nprint('locked', flush=True)\ntime.sleep(120)", str(path)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def kept_indices(model, method, prompt: list[int], tokenizer=None) -> list[torch.Tensor]:
    """Each layer's kept prompt columns, (1, Hkv, n), after ``method`` prefills one prompt."""
    state = prefill(model, method, make_batch(model, method, [prompt], pad_id=0, tokenizer=tokenizer))
    return [layer.kept_indices for layer in state.cache.layers]


def kept_columns(cache, full, layer_idx: int) -> list[list[int]]:
    """The prompt column of each key another implementation kept in ``cache``, per KV head, found
    by exact match against the uncompressed cache ``full``."""
    theirs, all_keys = cache.layers[layer_idx].keys[0], full.layers[layer_idx].keys[0]
    out = []
    for head in range(theirs.shape[0]):
        dist = (theirs[head][:, None] - all_keys[head][None]).abs().amax(dim=-1)
        assert torch.all(dist.min(dim=1).values < 1e-5)
        out.append(sorted(dist.argmin(dim=1).tolist()))
    return out

"""Per-layer budget schedules shared by the methods that take one (PyramidKV, DapQ's ``layer_budget``)."""

from __future__ import annotations

#: The per-layer budget schedules every method accepts (``Method.layer_budget``).
LAYER_BUDGETS = ("flat", "pyramid")


def pyramid_budgets(budget: int, window: int, prompt_len: int, num_layers: int, beta: int = 20) -> list[int]:
    """KVCache-Factory's PyramidKV schedule, with the mean budget held exactly at ``budget``.

    With ``m = budget - window``: ``min = m // beta``, ``max = 2m - min``; if ``max`` exceeds
    what the prompt can supply it is clipped to ``prompt_len - window`` and ``min`` rebalanced;
    layer ``l`` keeps ``max - l * (max - min) / (L - 1) + window``. Prompts shorter than ``2m``
    get the flat budget everywhere.

    KVCache-Factory floors the step to an integer, which makes the mean budget drift above the
    requested one (by about 10% at budget 128 over 30 layers); here the linear ramp is rounded
    per layer and the rounding remainder spread over the first layers, so that comparisons with
    flat-budget methods are at exactly the same total memory.
    """
    m = budget - window
    if prompt_len <= budget or prompt_len < 2 * m or m <= 0 or num_layers == 1:
        return [budget] * num_layers
    low = m // beta
    high = 2 * m - low
    if high >= prompt_len - window:
        high = prompt_len - window
        low = 2 * m - high
    step = (high - low) / (num_layers - 1)
    ramp = [round(high - layer * step) for layer in range(num_layers)]
    surplus = m * num_layers - sum(ramp)
    for layer in range(abs(surplus)):
        ramp[layer % num_layers] += 1 if surplus > 0 else -1
    return [r + window for r in ramp]

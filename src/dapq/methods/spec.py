"""Method specs: a method name with fixed parameters, as ``--methods`` lists and records name them.

``dapq(keep_recent=32,content=random_vocab)`` names a dapq method with parameters;
``kvpress:TOVAPress(window_size=64)`` a kvpress press that runs as a peer through kvpress's own
pipeline. A spec builds its method at any budget or kept fraction, and gives the configuration a
results record stores (and hashes into the cell's key).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError
from .legacy import legacy_config
from .registry import build, method_class


@dataclass(frozen=True)
class MethodSpec:
    """A method name plus fixed parameters, e.g. ``dapq(keep_recent=32,content=random_vocab)``.

    A name ``kvpress:PressName`` is a kvpress press, run as a peer through kvpress's own pipeline
    (:mod:`dapq.integrations.kvpress_peer`); its parameters are the press's arguments.
    """

    label: str
    name: str
    params: tuple[tuple[str, object], ...] = ()

    @property
    def peer(self) -> str | None:
        """``"kvpress"`` for a kvpress press, None for a dapq method."""
        return "kvpress" if self.name.startswith(KVPRESS) else None

    @property
    def evicts(self) -> bool:
        """False for the methods that keep everything (they run once, at no budget)."""
        return bool(self.peer) or method_class(self.name).evicts

    def build(self, budget: int | None = None, keep_fraction: float | None = None):
        """The dapq method with this budget or kept fraction (FullKV takes neither)."""
        if self.peer:
            raise ConfigError(f"{self.label} is a kvpress press, not a dapq method")
        params = dict(self.params)
        fixed = sorted({"budget", "keep_fraction"} & set(params))
        if fixed:
            raise ConfigError(f"{self.label}: give {' and '.join(fixed)} with --budgets / --keep-fractions, "
                              "not as a method parameter")
        try:
            if not self.evicts:
                return build(self.name, **params)
            return build(self.name, budget=budget, keep_fraction=keep_fraction, **params)
        except (TypeError, ValueError) as exc:  # ConfigError included: say which entry of the list
            raise ConfigError(f"{self.label}: bad parameter ({exc})") from None

    def config(self, budget: int | None = None, keep_fraction: float | None = None) -> dict:
        """What determines this cell's result, as recorded (and hashed into its key)."""
        if self.peer:
            return {"method": self.name, "press": self.name[len(KVPRESS):], "press_kwargs": dict(self.params),
                    "budget": budget, "keep_fraction": keep_fraction}
        return self.build(budget, keep_fraction).config()

    def legacy_config(self, budget: int | None = None, keep_fraction: float | None = None) -> dict | None:
        """The configuration results files written before the rename recorded for this cell, if any."""
        return legacy_config(self.config(budget, keep_fraction))


KVPRESS = "kvpress:"


def split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and quotes.

    So ``dapq(token_ids=(1,2,3)),snapkv`` is two methods and ``token_ids=(1,2,3), n_pseudo=8``
    two parameters; an unbalanced bracket leaves the rest in one piece, which the caller rejects.
    """
    parts, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        else:
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    return parts


def parse_methods(spec: str, check_peers: Callable[[list[tuple[str, dict]]], None] | None = None
                  ) -> list[MethodSpec]:
    """Parse ``full,dapq,snapkv(window=16,kernel=5),kvpress:TOVAPress`` into method specs (validated).

    ``check_peers``, given ``(press name, arguments)`` of every kvpress entry, refuses presses or
    arguments kvpress lacks (the benchmark passes :func:`dapq.integrations.kvpress_peer.check_presses`;
    the methods package itself never imports an integration).
    """
    out = []
    for raw in (p.strip() for p in split_top_level(spec)):
        if not raw:
            raise ConfigError(f"empty method in {spec!r}")
        m = re.fullmatch(r"([a-z_0-9]+|kvpress:[A-Za-z_0-9]+)(?:\((.*)\))?", raw)
        if not m:
            raise ConfigError(f"cannot parse method {raw!r}; write name, name(key=value,...) or kvpress:PressName(...)")
        name, args = m.group(1), m.group(2)
        if not name.startswith(KVPRESS):
            method_class(name)  # unknown names fail here
        params = []
        for item in filter(None, (a.strip() for a in split_top_level(args or ""))):
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"method parameter {item!r} needs key=value")
            try:
                parsed = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                parsed = value.strip()
            params.append((key.strip(), parsed))
        out.append(MethodSpec(label=raw, name=name, params=tuple(params)))
        if out[-1].peer is None:
            out[-1].build(64)  # validate parameters now, not an hour into the sweep
    peers = [(s.name[len(KVPRESS):], dict(s.params)) for s in out if s.peer]
    if peers and check_peers is not None:
        check_peers(peers)
    return out

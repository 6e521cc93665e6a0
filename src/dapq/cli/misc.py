"""``dapq methods`` and ``dapq demo``."""

from __future__ import annotations

from pathlib import Path

import typer

from ..demo import run_demo
from ..errors import ConfigError
from ..methods import available, method_class
from . import options as opt
from .app import app
from .setup import load


@app.command()
def methods() -> None:
    """List the registered compression methods."""
    for name in available():
        typer.echo(f"{name:14s} {method_class(name).paper}")


@app.command()
def demo(
    model: str = opt.MODEL,
    length: int = typer.Option(2000, "--length", help="Prompt length in tokens."),
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Where the demo keeps its results."),
) -> None:
    """Short NIAH comparison: FullKV, StreamingLLM, SnapKV and DapQ at budgets 64 and 128."""
    if length < 1:  # before the model loads (or the embedded model converts: 20 s)
        raise ConfigError(f"--length must be >= 1 token, got {length}")
    lm, tokenizer = load(model)
    run_demo(lm, tokenizer, length=length, out=out, model_id=model or opt.DEFAULT_MODEL_ID)

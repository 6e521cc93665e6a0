"""The typer applications the commands of :mod:`dapq.cli` register on."""

from __future__ import annotations

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="KV-cache compression for Hugging Face causal LMs: DapQ and its baselines.",
)
analyze_app = typer.Typer(no_args_is_help=True, help="The paper's analyses: similarity, recall, ablations.")
app.add_typer(analyze_app, name="analyze")

"""``dapq analyze``: the paper's analyses (query similarity, decode-attention recall, ablations)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..analysis.run import ABLATIONS, render, run_ablation, run_recall, run_similarity
from ..bench.report import table
from ..bench.runner import parse_budgets
from ..bench.store import ResultsStore
from ..bench.tasks import TaskArgs, build_samples
from ..errors import ConfigError
from ..methods.spec import parse_methods
from ..tables import markdown
from . import options as opt
from .app import analyze_app
from .setup import load

_TASKSET = typer.Option("niah", "--taskset", help="Prompt source: a bench task set (niah, ruler).")
_LENGTHS = typer.Option("2000", "--lengths", help="Prompt lengths in tokens.")
_SAMPLES = typer.Option(2, "--samples", help="Samples per task (niah: per length x depth).")
_SEED = typer.Option(0, "--seed")
_TASKS = typer.Option("", "--tasks", help="Subset of the task set's tasks.")


def _setup(model, taskset, lengths, samples, seed, out, tasks=""):
    """The model, its tokenizer, the prompts and the results store of an analysis."""
    args = TaskArgs(lengths=opt.int_list(lengths, "--lengths"), samples=samples, seed=seed,
                    tasks=tuple(t for t in tasks.split(",") if t))
    store = ResultsStore(out)
    lm, tokenizer = load(model)
    args.max_context = getattr(lm.config, "max_position_embeddings", None)
    return lm, tokenizer, build_samples(taskset, tokenizer, args), store


@analyze_app.command("similarity")
def analyze_similarity(
    model: str = opt.MODEL, taskset: str = _TASKSET, lengths: str = _LENGTHS, samples: int = _SAMPLES,
    seed: int = _SEED, tasks: str = _TASKS,
    window: int = typer.Option(32, "--window", help="N pseudo queries / decode steps compared."),
    out: Path = typer.Option(Path("runs/analysis"), "--out"),
) -> None:
    """Table 1 / Figure 2: pseudo vs real decoding queries under SC/DC x SP/DP."""
    if window < 1:
        raise ConfigError("--window must be >= 1")
    lm, tok, sample_list, store = _setup(model, taskset, lengths, samples, seed, out, tasks)
    run_similarity(lm, tok, sample_list, store, model_id=model or opt.DEFAULT_MODEL_ID, window=window, seed=seed)
    typer.echo(render(out))


@analyze_app.command("recall")
def analyze_recall(
    model: str = opt.MODEL, taskset: str = _TASKSET, lengths: str = _LENGTHS, samples: int = _SAMPLES,
    seed: int = _SEED, tasks: str = _TASKS,
    methods: str = typer.Option("dapq,snapkv,h2o,oracle", "--methods"),
    budget: int = typer.Option(128, "--budget"),
    windows: str = typer.Option("1,2,4,8,16,32,64,128", "--windows"),
    steps: int = typer.Option(32, "--steps", help="Real decoding steps that define the reference top-K."),
    out: Path = typer.Option(Path("runs/analysis"), "--out"),
) -> None:
    """Figure 3 / Table 8: recall of the oracle top-K and distribution cosine, by window."""
    parse_methods(methods)
    window_list = tuple(parse_budgets(windows))
    if budget < 1 or steps < 1:
        raise ConfigError("--budget and --steps must be >= 1")
    lm, tok, sample_list, store = _setup(model, taskset, lengths, samples, seed, out, tasks)
    run_recall(lm, tok, sample_list, store, model_id=model or opt.DEFAULT_MODEL_ID, methods=methods, budget=budget,
               windows=window_list, steps=steps)
    typer.echo(render(out))


@analyze_app.command("ablation")
def analyze_ablation(
    part: str = typer.Argument(..., help="a (content), b (window N) or c (insert position)."),
    model: str = opt.MODEL, taskset: str = _TASKSET, lengths: str = _LENGTHS, samples: int = _SAMPLES,
    seed: int = _SEED, tasks: str = _TASKS,
    budget: int = typer.Option(128, "--budget"),
    steps: int = typer.Option(32, "--steps"),
    accuracy: bool = typer.Option(True, "--accuracy/--no-accuracy", help="Also run the accuracy cells."),
    out: Path = typer.Option(Path("runs/ablation"), "--out"),
) -> None:
    """Figure 4: DapQ's content, window and position choices, as recall and as accuracy."""
    if part not in ABLATIONS:
        raise ConfigError(f"ablation part must be one of {', '.join(ABLATIONS)}")
    out = out / part
    lm, tok, sample_list, _ = _setup(model, taskset, lengths, samples, seed, out, tasks)
    acc = run_ablation(lm, tok, sample_list, out, model_id=model or opt.DEFAULT_MODEL_ID, part=part, budget=budget,
                       steps=steps, accuracy=accuracy)
    typer.echo(render(out))
    if acc is not None:
        typer.echo(markdown(*table(list(acc), sample_list[0].taskset)))

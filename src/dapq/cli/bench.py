"""``dapq bench`` (accuracy sweeps), ``dapq bench speed`` and ``dapq report``."""

from __future__ import annotations

from pathlib import Path

import torch
import typer

from ..bench.report import render, table, usable
from ..bench.runner import COMPRESS_MODES, parse_budgets, parse_keep_fractions, run_sweep
from ..bench.speed import PARTS, QUICK, SpeedConfig, SpeedRun
from ..bench.store import ResultsStore
from ..bench.tasks import TaskArgs, build_samples
from ..errors import ConfigError
from ..methods import available, method_class
from ..methods.spec import parse_methods
from ..models import ModelSpec, resolve_device
from ..tables import markdown
from . import options as opt
from .app import app
from .setup import load, model_and_executor


def _kvpress_peer():
    """The kvpress integration, imported only when a command has kvpress cells."""
    from ..integrations import kvpress_peer

    return kvpress_peer


def _check_peers(presses: list[tuple[str, dict]]) -> None:
    _kvpress_peer().check_presses(presses)


@app.command()
def bench(
    taskset: str = typer.Argument(..., help="niah, ruler, longbench, longbench-v2 or helmet "
                                  "(or speed: see `dapq bench speed --help`)."),
    methods: str = typer.Option("full,dapq,snapkv", "--methods", help="Comma list; name(key=value,...) sets "
                                "parameters; kvpress:PressName(...) runs a kvpress press through kvpress's pipeline."),
    budgets: str = typer.Option(None, "--budgets", help="Comma list of KV budgets (tokens per KV head per layer; "
                                "default 64,128,256 unless --keep-fractions is given)."),
    keep_fractions: str = typer.Option(None, "--keep-fractions", help="Comma list of fractions of each prompt "
                                       "(or context) kept, in (0, 1) (kvpress's compression_ratio is 1 - this)."),
    compress: str = typer.Option("prompt", "--compress", help="prompt: compress the whole prompt (the paper's "
                                 "setting); context: compress the context only, then feed the question."),
    model: str = opt.MODEL,
    lengths: str = typer.Option("", "--lengths", help="Prompt lengths in tokens (niah, ruler: default 4000; "
                                "longbench, helmet: truncation length, default the model's context)."),
    samples: int = typer.Option(2, "--samples", help="Samples per cell (niah: per length x depth)."),
    seed: int = typer.Option(0, "--seed"),
    out: Path = typer.Option(Path("runs/bench"), "--out", help="Output directory (results.jsonl, report)."),
    depths: str = typer.Option("0,0.25,0.5,0.75,1", "--depths", help="NIAH needle depths."),
    tasks: str = typer.Option("", "--tasks", help="Subset of the task set's tasks (comma list)."),
    data: str = typer.Option(None, "--data", help="The benchmark's own data folder (LongBench's data/ with "
                             "{task}.jsonl, LongBench v2's data.json, HELMET's data/ with kilt/ and hf/ exports), "
                             "or 'hub' (needs the `datasets` extra)."),
    haystack: str = typer.Option("essays", "--haystack", help="essays, held_out or noise."),
    shared_prefill: bool = typer.Option(True, "--shared-prefill/--prefill-per-cell", help="One FullKV prefill "
                                        "per prompt, compressed per method (same outputs, faster), or one "
                                        "prefill per cell."),
    decode_batch: int = typer.Option(8, "--decode-batch", help="Cells of one prompt decoded together "
                                     "(with --shared-prefill)."),
    dtype: str = opt.DTYPE,
    device: str = opt.DEVICE,
    use_ray: bool = opt.RAY,
    ray_address: str = opt.RAY_ADDRESS,
    workers: int = opt.WORKERS,
    gpus_per_worker: float = opt.GPUS,
) -> None:
    """Run a resumable accuracy sweep; finished cells are kept in OUT/results.jsonl."""
    if compress not in COMPRESS_MODES:
        raise ConfigError(f"--compress must be one of {', '.join(COMPRESS_MODES)}, got {compress!r}")
    specs = parse_methods(methods, check_peers=_check_peers)
    fractions = parse_keep_fractions(keep_fractions) if keep_fractions is not None else []
    budget_list = parse_budgets(budgets) if budgets is not None else [] if fractions else [64, 128, 256]
    try:
        length_list = tuple(int(x) for x in lengths.split(",") if x.strip())
        depth_list = tuple(float(x) for x in depths.split(",") if x.strip())
    except ValueError:
        raise ConfigError("--lengths must be integers and --depths numbers") from None
    if decode_batch < 1:
        raise ConfigError("--decode-batch must be >= 1")
    args = TaskArgs(lengths=length_list, samples=samples, seed=seed, depths=depth_list, data=data,
                    tasks=tuple(t for t in tasks.split(",") if t), haystack=haystack)
    store = ResultsStore(out)  # a foreign or corrupt file, or a second writer, fails here, before any work
    spec = ModelSpec(model, dtype=dtype, device=device)
    with model_and_executor(spec, opt.RayOptions(use_ray, ray_address, workers, gpus_per_worker)) as setup:
        args.max_context = setup.max_context
        sample_list = build_samples(taskset, setup.tokenizer, args)
        run_sweep(setup.model, setup.tokenizer, sample_list, specs, budget_list, store,
                  model_id=model or opt.DEFAULT_MODEL_ID, keep_fractions=fractions, compress=compress,
                  model_spec=spec, shared_prefill=shared_prefill, decode_batch=decode_batch,
                  executor=setup.executor, max_context=setup.max_context)
    header, rows = table(usable(list(store)), sample_list[0].taskset)
    typer.echo(markdown(header, rows))


@app.command("bench-speed", hidden=True)
def bench_speed(
    methods: str = typer.Option(None, "--methods", help="Comma list (default: full and every method; "
                                "--quick: full,dapq,snapkv,streamingllm)."),
    budget: int = typer.Option(None, "--budget", help="KV budget of the compressing methods (default 128)."),
    context: int = typer.Option(None, "--context", help="Context of the decode / e2e / kvpress cells (default 4000)."),
    lengths: str = typer.Option(None, "--lengths", help="TTFT context lengths (default 1000,2000,4000,8000)."),
    batches: str = typer.Option(None, "--batches", help="Decode batch sizes (default 1,2,4,... up to --max-batch)."),
    max_batch: int = typer.Option(None, "--max-batch", help="Largest default batch (32 on CPU, 512 on CUDA)."),
    decode_tokens: int = typer.Option(None, "--decode-tokens", help="New tokens per decode run (default 32)."),
    repeats: int = typer.Option(None, "--repeats", help="Timed runs per cell (default 3)."),
    warmup: int = typer.Option(None, "--warmup", help="Untimed runs per cell (default 1)."),
    parts: str = typer.Option("ttft,decode,e2e,peer", "--parts", help="Which cells: ttft, decode, e2e, peer."),
    peers: str = typer.Option("snapkv,streamingllm", "--peers", help="kvpress presses for the peer rows (snapkv, "
                              "streamingllm with dapq's settings, or kvpress:PressName), or none."),
    quick: bool = typer.Option(False, "--quick", help="Tiny sizes, every kind of cell: a smoke test (< 2 min)."),
    model: str = opt.MODEL,
    random_weights: str = typer.Option(None, "--random-weights", help="Build a random-weight model from a "
                                       "config: llama-3.1-8b, llama-3-8b, qwen2.5-7b (shipped) or a config.json path."),
    dtype: str = typer.Option(None, "--dtype", help="Default float32 on CPU, bfloat16 on CUDA."),
    device: str = opt.DEVICE,
    attn: str = opt.ATTN,
    decode: str = opt.DECODE,
    memory_limit: float = typer.Option(None, "--memory-limit", help="GiB a CPU cell may use before it is "
                                       "reported OOM unrun (default: 90% of free memory)."),
    out: Path = typer.Option(Path("runs/speed"), "--out", help="Output directory (results.jsonl, report.md)."),
) -> None:
    """Throughput, TTFT and memory of every method, side by side with kvpress; resumable."""
    device = str(resolve_device(device))
    dtype = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    cfg = _speed_config(quick, device, context, budget, lengths, batches, max_batch, decode_tokens, repeats, warmup,
                        parts, memory_limit, decode)
    peer_list = _speed_peers(peers, cfg)
    default_methods = "full,dapq,snapkv,streamingllm" if quick else ",".join(
        m for m in available() if not method_class(m).analysis_only and m != "random")
    specs = parse_methods(methods or default_methods)
    if any(method_class(s.name).analysis_only for s in specs if not s.peer):
        raise ConfigError("analysis-only methods (oracle) have no place in a speed benchmark")
    store = ResultsStore(out)
    lm, tokenizer = load(model, random_weights=random_weights, dtype=dtype, device=device, attn=attn)
    limit = getattr(lm.config, "max_position_embeddings", None)
    longest = max(cfg.needed_lengths()) + max(cfg.decode_tokens, 64)
    if limit is not None and longest > limit:
        raise ConfigError(f"contexts up to {longest} tokens (with decoding) exceed the model's {limit}")
    peer = None
    if peer_list:
        spec = {"model": model, "random_weights": random_weights, "dtype": dtype, "device": device, "attn": attn,
                "threads": torch.get_num_threads(), "budget": cfg.budget, "presses": list(peer_list),
                "decode_tokens": cfg.decode_tokens, "repeats": cfg.repeats, "warmup": cfg.warmup}
        peer = lambda ids, _cfg: _kvpress_peer().run_kvpress({**spec, "ids": ids})  # noqa: E731
    run = SpeedRun(lm, tokenizer, specs, store, cfg, model_id=model or random_weights or opt.DEFAULT_MODEL_ID,
                   peer=peer, echo=lambda msg: typer.echo(f"speed: {msg}", err=True))
    run.run()
    typer.echo(render(out, plots=False))


def _given(value, default):
    """``value`` unless the option was left out. Not ``value or default``: an explicit 0 is refused later."""
    return default if value is None else value


def _speed_config(quick, device, context, budget, lengths, batches, max_batch, decode_tokens, repeats, warmup,
                  parts, memory_limit, decode) -> SpeedConfig:
    """The speed run's configuration from its options, checking only the cells it will make."""
    base = QUICK if quick else SpeedConfig()
    if batches is not None:
        batch_list = opt.int_list(batches, "--batches")
    elif quick:
        batch_list = base.batches
    else:
        top = _given(max_batch, 512 if device.startswith("cuda") else 32)
        if top < 1:
            raise ConfigError(f"--max-batch must be >= 1, got {top}")
        batch_list = tuple(2**i for i in range(top.bit_length()) if 2**i <= top)
    part_list = tuple(p for p in parts.split(",") if p)
    if not part_list or set(part_list) - set(PARTS):
        raise ConfigError(f"--parts must be a comma list of {', '.join(PARTS)}")
    if memory_limit is not None and memory_limit <= 0:
        raise ConfigError(f"--memory-limit must be a positive number of GiB, got {memory_limit:g}")
    cfg = SpeedConfig(
        context=_given(context, base.context), budget=_given(budget, base.budget),
        lengths=opt.int_list(lengths, "--lengths", 2) if lengths else base.lengths,
        batches=batch_list, decode_tokens=_given(decode_tokens, base.decode_tokens),
        repeats=_given(repeats, base.repeats), warmup=_given(warmup, base.warmup),
        parts=part_list, memory_limit=None if memory_limit is None else int(memory_limit * 2**30), decode=decode,
    )
    if cfg.repeats < 1 or cfg.warmup < 0 or cfg.decode_tokens < 2:
        raise ConfigError("--repeats must be >= 1, --warmup >= 0 and --decode-tokens >= 2")
    if cfg.context < 1:
        raise ConfigError(f"--context must be >= 1 token, got {cfg.context}")
    shortest = min(cfg.needed_lengths())
    if not 1 <= cfg.budget < shortest:
        raise ConfigError(f"--budget must lie in [1, {shortest}) to compress anything")
    return cfg


def _speed_peers(peers: str, cfg: SpeedConfig) -> tuple[str, ...]:
    """The kvpress presses of the peer rows (with the no-press baseline), checked before any model loads."""
    if "peer" not in cfg.parts or peers == "none":
        return ()
    peer_list = tuple(p for p in peers.split(",") if p)
    kvpress_peer = _kvpress_peer()
    presses = [kvpress_peer.speed_press(name) for name in peer_list]  # an unknown short name fails here
    # A kvpress:PressName kvpress lacks fails here too, in one line, not as an error cell after the run.
    named = [(press, {}) for name, press in zip(peer_list, presses, strict=True) if name.startswith("kvpress:")]
    if named:  # only a named press needs kvpress here; the short names run in the kvpress child later
        kvpress_peer.check_presses(named)
    return (*peer_list, kvpress_peer.NO_PRESS) if peer_list else ()  # the pipeline without a press: the baseline


@app.command()
def report(
    out: Path = typer.Argument(..., help="A sweep directory with results.jsonl."),
    no_plots: bool = typer.Option(False, "--no-plots"),
    against: str = typer.Option(None, "--against", help="A method label (e.g. snapkv, full, "
                                "kvpress:SnapKVPress): each row's paired difference to it on the same prompts."),
    output: Path = typer.Option(None, "--output", "-o", help="Write the markdown here instead of DIR/report.md "
                                "(e.g. one file per --against); the plots stay in DIR."),
) -> None:
    """Render tables (markdown) and plots (PNG) from a sweep's results file alone."""
    if output is not None and not output.parent.is_dir():
        raise ConfigError(f"--output {output}: the folder {output.parent} does not exist")
    typer.echo(render(out, plots=not no_plots, against=against, output=output))

"""The ``dapq`` command line.

Every user error (a :class:`~dapq.errors.DapqError`, a bad option, a missing file) is printed as
one line on stderr with exit code 2; tracebacks are kept for real bugs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from .errors import ConfigError, DapqError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="KV-cache compression for Hugging Face causal LMs: DapQ and its baselines.",
)


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _read_text(path: Path, what: str) -> str:
    if not path.is_file():
        raise DapqError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DapqError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:  # unreadable: permissions, I/O
        raise DapqError(f"{path}: {exc.strerror or exc}") from None
    if not text.strip():
        raise DapqError(f"{path}: the {what} is empty")
    return text


def _read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if (prompt is None) == (prompt_file is None):
        raise DapqError("give exactly one of --prompt and --prompt-file")
    if prompt_file is not None:
        return _read_text(prompt_file, "prompt")
    if not prompt.strip():
        raise DapqError("the prompt is empty")
    return prompt


_RAY = typer.Option(False, "--ray", help="Run on Ray: a local Ray, or the cluster of --ray-address "
                    "(--ray=ADDRESS works too). Needs pip install 'dapq[ray]'.")
_RAY_ADDRESS = typer.Option(None, "--ray-address", help="Join this running Ray cluster (auto, host:6379, "
                            "ray://host:10001); implies --ray.")
_WORKERS = typer.Option(1, "--workers", help="Ray actors, one model each (with --ray).")
_GPUS = typer.Option(None, "--gpus-per-worker", help="GPUs per Ray actor (default 1 where the cluster has "
                     "GPUs, else 0).")


def _ray_executor(spec, use_ray: bool, address: str | None, workers: int, gpus: float | None):
    """A :class:`~dapq.integrations.ray.RayExecutor` for --ray, or None for the local runner."""
    use_ray = use_ray or address is not None
    if not use_ray:
        if workers != 1 or gpus is not None:
            raise ConfigError("--workers and --gpus-per-worker need --ray")
        return None
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    try:
        from .integrations.ray import RayExecutor
    except ImportError:
        raise DapqError("--ray needs Ray: pip install 'dapq[ray]'") from None
    return RayExecutor(spec, workers=workers, gpus_per_worker=gpus, address=address)


@app.command()
def generate(
    prompt: str = typer.Option(None, "--prompt", help="Prompt text."),
    prompt_file: Path = typer.Option(None, "--prompt-file", help="Read the prompt from a file."),
    context_file: Path = typer.Option(None, "--context-file", help="Compress this context once and answer "
                                      "each --question from it (context-only compression)."),
    question: list[str] = typer.Option(None, "--question", help="A question about --context-file (repeatable)."),
    input_file: Path = typer.Option(None, "--input", help="Bulk: a JSONL file of requests (id, prompt or "
                                    "messages, optional method/budget/ratio)."),
    output_file: Path = typer.Option(None, "--output", help="Bulk: the JSONL output (resumable: ids already "
                                     "there are skipped)."),
    batch_size: int = typer.Option(4, "--batch-size", help="Bulk: requests of one method generated together."),
    model: str = typer.Option(None, "--model", help="Model dir or hub id (default: embedded SmolLM2-135M)."),
    method: str = typer.Option("dapq", "--method", help="Compression method."),
    budget: int = typer.Option(None, "--budget", help="Prompt tokens kept per KV head per layer."),
    ratio: float = typer.Option(None, "--ratio", help="Fraction of the prompt kept, in (0, 1)."),
    window: int = typer.Option(None, "--window", help="DapQ pseudo tokens N / SnapKV and H2O window."),
    content: str = typer.Option(None, "--content", help="DapQ pseudo content (or text:YOUR TEXT)."),
    preset: str = typer.Option(None, "--preset", help="A named parameter set of the method (dapq: paper)."),
    chat: bool = typer.Option(False, "--chat", help="Wrap the prompt in the chat template."),
    answer_prefix: str = typer.Option(None, "--answer-prefix", help="Text after the generation prompt."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Tokens to generate."),
    sample: bool = typer.Option(False, "--sample", help="Sample instead of greedy decoding."),
    temperature: float = typer.Option(1.0, "--temperature"),
    top_p: float = typer.Option(1.0, "--top-p"),
    seed: int = typer.Option(0, "--seed"),
    stop: list[str] = typer.Option(None, "--stop", help="Stop string (repeatable)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16."),
    device: str = typer.Option(None, "--device", help="cpu or cuda (default: cuda if available)."),
    attn: str = typer.Option("sdpa", "--attn", help="Attention implementation: sdpa, eager, or a flash_attention_* this transformers offers (CUDA)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with figures (one per question)."),
    use_ray: bool = _RAY,
    ray_address: str = _RAY_ADDRESS,
    workers: int = _WORKERS,
    gpus_per_worker: float = _GPUS,
) -> None:
    """Compress the prompt's KV cache with one method and generate (or a JSONL file of prompts: --input).

    With --context-file, only the context is compressed, once; each --question is then answered
    from the same compressed cache (the question itself is not compressed).
    """
    if ratio is not None and budget is not None:
        raise ConfigError("give --budget or --ratio, not both")
    from .generation import SamplingConfig

    sampling = SamplingConfig(
        max_new_tokens=max_new_tokens, do_sample=sample, temperature=temperature, top_p=top_p, seed=seed,
        stop=tuple(stop or ()),
    )
    if input_file is not None or output_file is not None:
        if prompt is not None or prompt_file is not None or context_file is not None or question:
            raise DapqError("give --input (bulk) or --prompt/--prompt-file/--context-file, not both")
        return _generate_bulk(input_file, output_file, model, method, budget, ratio, window, content, preset, chat,
                              answer_prefix, sampling, batch_size, dtype, device, attn, use_ray, ray_address,
                              workers, gpus_per_worker)
    if use_ray or ray_address is not None or workers != 1 or gpus_per_worker is not None:
        raise ConfigError("--ray, --workers and --gpus-per-worker run bulk generation (--input/--output); "
                          "one prompt runs here")
    from .methods.registry import build_from_options

    chosen = build_from_options(method, budget=budget, keep_fraction=ratio, window=window, content=content,
                                 preset=preset)
    if context_file is not None:
        if prompt is not None or prompt_file is not None:
            raise DapqError("give --context-file with --question, or --prompt/--prompt-file, not both")
        questions = [q for q in (question or []) if q.strip()]
        if not questions or len(questions) != len(question or []):
            raise DapqError("--context-file needs at least one non-empty --question")
        text = _read_text(context_file, "context")
    elif question:
        raise DapqError("--question needs --context-file (or put the question in the prompt)")
    else:
        text = _read_prompt(prompt, prompt_file)
    from .bulk import result_fields
    from .generation import generate as run
    from .models import load_model

    _quiet_transformers()
    lm, tokenizer = load_model(model, dtype=dtype, device=device, attn_implementation=attn)
    if context_file is None:
        result = run(lm, tokenizer, [text], chosen, sampling, chat=chat, answer_prefix=answer_prefix)[0]
        typer.echo(json.dumps(result_fields(result, chosen)) if as_json else result.text)
        return
    from .context import ask, compress_context

    ctx = compress_context(lm, tokenizer, [text], chosen, chat=chat)
    results = ask(lm, tokenizer, ctx, questions, answer_prefix=answer_prefix, sampling=sampling)
    for i, (q, result) in enumerate(zip(questions, results, strict=True)):
        if as_json:
            typer.echo(json.dumps({"question": q, **result_fields(result, chosen)}))
        elif len(questions) == 1:
            typer.echo(result.text)
        else:
            typer.echo(f"{'' if i == 0 else chr(10)}[{i + 1}] {q}\n{result.text}")


def _generate_bulk(input_file, output_file, model, method, budget, ratio, window, content, preset, chat,
                   answer_prefix, sampling, batch_size, dtype, device, attn, use_ray, ray_address, workers,
                   gpus_per_worker) -> None:
    """``dapq generate --input prompts.jsonl --output out.jsonl``: every request, resumable."""
    from contextlib import nullcontext

    from .bulk import GenerationLog, MethodDefaults, encode_requests, read_requests, run_bulk
    from .models import ModelSpec

    if input_file is None or output_file is None:
        raise DapqError("bulk generation needs both --input and --output")
    if batch_size < 1:
        raise ConfigError("--batch-size must be >= 1")
    if output_file.exists() and input_file.exists() and output_file.resolve() == input_file.resolve():
        raise DapqError("--output must not be the --input file")
    defaults = MethodDefaults(method=method, budget=budget, ratio=ratio, window=window, content=content,
                              preset=preset)
    requests = read_requests(input_file, defaults)  # every bad line fails here, before any loading
    log = GenerationLog(output_file)  # a second writer, or a foreign file, fails here
    spec = ModelSpec(model, dtype=dtype, device=device, attn_implementation=attn)
    _quiet_transformers()
    executor = _ray_executor(spec, use_ray, ray_address, workers, gpus_per_worker)
    with executor or nullcontext():
        if executor is None:
            from .bench.executor import LocalExecutor

            lm, tokenizer = spec.load()
            config, runner = lm.config, LocalExecutor(lm, tokenizer)
        else:
            (tokenizer, config), runner = spec.load_tokenizer_and_config(), executor
        requests = encode_requests(requests, tokenizer, input_file, chat=chat, answer_prefix=answer_prefix,
                                   max_context=getattr(config, "max_position_embeddings", None),
                                   max_new_tokens=sampling.max_new_tokens)
        done = sum(r.id in log for r in requests)
        written = run_bulk(runner, requests, log, sampling=sampling, batch_size=batch_size)
    typer.echo(f"{written} generated, {done} already in {output_file}", err=True)


@app.command()
def methods() -> None:
    """List the registered compression methods."""
    from .methods import available, method_class

    for name in available():
        cls = method_class(name)
        typer.echo(f"{name:14s} {cls.paper}")


@app.command()
def bench(
    taskset: str = typer.Argument(..., help="niah, ruler, longbench, longbench-v2 or helmet "
                                  "(or speed: see `dapq bench speed --help`)."),
    methods: str = typer.Option("full,dapq,snapkv", "--methods", help="Comma list; name(key=value,...) sets "
                                "parameters; kvpress:PressName(...) runs a kvpress press through kvpress's pipeline."),
    budgets: str = typer.Option(None, "--budgets", help="Comma list of KV budgets (tokens per KV head per layer; "
                                "default 64,128,256 unless --ratios is given)."),
    ratios: str = typer.Option(None, "--ratios", help="Comma list of fractions of each prompt (or context) kept, "
                               "in (0, 1): kvpress's 1 - compression_ratio."),
    compress: str = typer.Option("prompt", "--compress", help="prompt: compress the whole prompt (the paper's "
                                 "setting); context: compress the context only, then feed the question."),
    model: str = typer.Option(None, "--model", help="Model dir or hub id (default: embedded SmolLM2-135M)."),
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
    dtype: str = typer.Option("float32", "--dtype"),
    device: str = typer.Option(None, "--device"),
    use_ray: bool = _RAY,
    ray_address: str = _RAY_ADDRESS,
    workers: int = _WORKERS,
    gpus_per_worker: float = _GPUS,
) -> None:
    """Run a resumable accuracy sweep; finished cells are kept in OUT/results.jsonl."""
    from .bench.report import markdown, table
    from .bench.runner import COMPRESS_MODES, parse_budgets, parse_methods, parse_ratios, run_sweep
    from .bench.store import ResultsStore
    from .bench.tasks import TaskArgs, build_samples

    if compress not in COMPRESS_MODES:
        raise ConfigError(f"--compress must be one of {', '.join(COMPRESS_MODES)}, got {compress!r}")
    specs = parse_methods(methods)
    ratio_list = parse_ratios(ratios) if ratios is not None else []
    budget_list = parse_budgets(budgets) if budgets is not None else [] if ratio_list else [64, 128, 256]
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
    _quiet_transformers()
    from contextlib import nullcontext

    from .models import ModelSpec

    spec = ModelSpec(model, dtype=dtype, device=device)
    executor = _ray_executor(spec, use_ray, ray_address, workers, gpus_per_worker)
    with executor or nullcontext():
        # With Ray the driver only tokenises, schedules and writes: the weights load on the workers.
        if executor is None:
            lm, tokenizer = spec.load()
            config = lm.config
        else:
            lm = None
            tokenizer, config = spec.load_tokenizer_and_config()
        args.max_context = max_context = getattr(config, "max_position_embeddings", None)
        sample_list = build_samples(taskset, tokenizer, args)
        run_sweep(lm, tokenizer, sample_list, specs, budget_list, store, model_id=model or "smollm2-135m",
                  ratios=ratio_list, compress=compress, model_spec=spec, shared_prefill=shared_prefill,
                  decode_batch=decode_batch, executor=executor, max_context=max_context)
    header, rows = table(list(store), sample_list[0].taskset)
    typer.echo(markdown(header, rows))


def _int_list(text: str, what: str, minimum: int = 1) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{what} must be a comma list of integers, got {text!r}") from None
    if not values or min(values) < minimum:
        raise ConfigError(f"{what} must be integers >= {minimum}, got {text!r}")
    return values


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
    model: str = typer.Option(None, "--model", help="Model dir or hub id (default: embedded SmolLM2-135M)."),
    random_weights: str = typer.Option(None, "--random-weights", help="Build a random-weight model from a "
                                       "config: llama-3-8b, qwen2.5-7b (shipped) or a config.json path."),
    dtype: str = typer.Option(None, "--dtype", help="Default float32 on CPU, bfloat16 on CUDA."),
    device: str = typer.Option(None, "--device"),
    attn: str = typer.Option("sdpa", "--attn", help="sdpa, eager, or a flash_attention_* this transformers offers (CUDA)."),
    memory_limit: float = typer.Option(None, "--memory-limit", help="GiB a CPU cell may use before it is "
                                       "reported OOM unrun (default: 90% of free memory)."),
    out: Path = typer.Option(Path("runs/speed"), "--out", help="Output directory (results.jsonl, report.md)."),
) -> None:
    """Throughput, TTFT and memory of every method, side by side with kvpress; resumable."""
    import torch

    from .bench.report import render
    from .bench.runner import parse_methods
    from .bench.speed import PARTS, QUICK, SpeedConfig, SpeedRun
    from .bench.store import ResultsStore
    from .integrations.kvpress_peer import NO_PRESS, run_kvpress, speed_press
    from .methods import available, method_class
    from .models import resolve_device

    base = QUICK if quick else SpeedConfig()
    device = str(resolve_device(device))
    dtype = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if model is not None and random_weights is not None:
        raise ConfigError("give --model or --random-weights, not both")
    if batches is not None:
        batch_list = _int_list(batches, "--batches")
    elif quick:
        batch_list = base.batches
    else:
        top = max_batch or (512 if device.startswith("cuda") else 32)
        batch_list = tuple(2**i for i in range(top.bit_length()) if 2**i <= top)
    part_list = tuple(p for p in parts.split(",") if p)
    if not part_list or set(part_list) - set(PARTS):
        raise ConfigError(f"--parts must be a comma list of {', '.join(PARTS)}")
    peer_list = () if peers == "none" else tuple(p for p in peers.split(",") if p)
    for name in peer_list:
        speed_press(name)  # an unknown peer fails here, before any model loads
    if peer_list:
        peer_list = (*peer_list, NO_PRESS)  # the pipeline without a press: each press's prefill cost
    cfg = SpeedConfig(
        context=context or base.context, budget=budget or base.budget,
        lengths=_int_list(lengths, "--lengths", 2) if lengths else base.lengths,
        batches=batch_list, decode_tokens=decode_tokens or base.decode_tokens,
        repeats=repeats if repeats is not None else base.repeats,
        warmup=warmup if warmup is not None else base.warmup,
        parts=part_list, memory_limit=None if memory_limit is None else int(memory_limit * 2**30),
    )
    if cfg.repeats < 1 or cfg.warmup < 0 or cfg.decode_tokens < 2:
        raise ConfigError("--repeats must be >= 1, --warmup >= 0 and --decode-tokens >= 2")
    if not 1 <= cfg.budget < min(cfg.context, *cfg.lengths):
        raise ConfigError(f"--budget must lie in [1, {min(cfg.context, *cfg.lengths)}) to compress anything")
    default_methods = "full,dapq,snapkv,streamingllm" if quick else ",".join(
        m for m in available() if not method_class(m).analysis_only and m != "random")
    specs = parse_methods(methods or default_methods)
    if any(method_class(s.name).analysis_only for s in specs):
        raise ConfigError("analysis-only methods (oracle) have no place in a speed benchmark")
    store = ResultsStore(out)
    _quiet_transformers()
    from .models import load_model, random_model

    if random_weights is not None:
        lm, tokenizer = random_model(random_weights, dtype=dtype, device=device, attn_implementation=attn), None
    else:
        lm, tokenizer = load_model(model, dtype=dtype, device=device, attn_implementation=attn)
    limit = getattr(lm.config, "max_position_embeddings", None)
    longest = max(cfg.context, *cfg.lengths) + max(cfg.decode_tokens, 64)
    if limit is not None and longest > limit:
        raise ConfigError(f"contexts up to {longest} tokens (with decoding) exceed the model's {limit}")
    peer = None
    if "peer" in cfg.parts and peer_list:
        spec = {"model": model, "random_weights": random_weights, "dtype": dtype, "device": device, "attn": attn,
                "threads": torch.get_num_threads(), "budget": cfg.budget, "presses": list(peer_list),
                "decode_tokens": cfg.decode_tokens, "repeats": cfg.repeats, "warmup": cfg.warmup}
        peer = lambda ids, _cfg: run_kvpress({**spec, "ids": ids})  # noqa: E731
    run = SpeedRun(lm, tokenizer, specs, store, cfg, model_id=model or random_weights or "smollm2-135m",
                   peer=peer, echo=lambda msg: typer.echo(f"speed: {msg}", err=True))
    run.run()
    typer.echo(render(out, plots=False))


@app.command()
def report(
    out: Path = typer.Argument(..., help="A sweep directory with results.jsonl."),
    no_plots: bool = typer.Option(False, "--no-plots"),
) -> None:
    """Render tables (markdown) and plots (PNG) from a sweep's results file alone."""
    from .bench.report import render

    typer.echo(render(out, plots=not no_plots))


analyze_app = typer.Typer(no_args_is_help=True, help="The paper's analyses: similarity, recall, ablations.")
app.add_typer(analyze_app, name="analyze")


def _analysis_setup(model, taskset, lengths, samples, seed, out, tasks=""):
    from .bench.store import ResultsStore
    from .bench.tasks import TaskArgs, build_samples
    from .models import load_model

    try:
        length_list = tuple(int(x) for x in lengths.split(",") if x.strip())
    except ValueError:
        raise ConfigError("--lengths must be integers") from None
    args = TaskArgs(lengths=length_list, samples=samples, seed=seed, tasks=tuple(t for t in tasks.split(",") if t))
    store = ResultsStore(out)
    _quiet_transformers()
    lm, tokenizer = load_model(model)
    args.max_context = getattr(lm.config, "max_position_embeddings", None)
    return lm, tokenizer, build_samples(taskset, tokenizer, args), store


_MODEL = typer.Option(None, "--model", help="Model dir or hub id (default: embedded SmolLM2-135M).")
_TASKSET = typer.Option("niah", "--taskset", help="Prompt source: a bench task set (niah, ruler).")
_LENGTHS = typer.Option("2000", "--lengths", help="Prompt lengths in tokens.")
_SAMPLES = typer.Option(2, "--samples", help="Samples per task (niah: per length x depth).")
_SEED = typer.Option(0, "--seed")
_TASKS = typer.Option("", "--tasks", help="Subset of the task set's tasks.")


@analyze_app.command("similarity")
def analyze_similarity(
    model: str = _MODEL, taskset: str = _TASKSET, lengths: str = _LENGTHS, samples: int = _SAMPLES,
    seed: int = _SEED, tasks: str = _TASKS,
    window: int = typer.Option(32, "--window", help="N pseudo queries / decode steps compared."),
    out: Path = typer.Option(Path("runs/analysis"), "--out"),
) -> None:
    """Table 1 / Figure 2: pseudo vs real decoding queries under SC/DC x SP/DP."""
    from .analysis.run import render, run_similarity

    if window < 1:
        raise ConfigError("--window must be >= 1")
    lm, tok, sample_list, store = _analysis_setup(model, taskset, lengths, samples, seed, out, tasks)
    run_similarity(lm, tok, sample_list, store, model_id=model or "smollm2-135m", window=window, seed=seed)
    typer.echo(render(out))


@analyze_app.command("recall")
def analyze_recall(
    model: str = _MODEL, taskset: str = _TASKSET, lengths: str = _LENGTHS, samples: int = _SAMPLES,
    seed: int = _SEED, tasks: str = _TASKS,
    methods: str = typer.Option("dapq,snapkv,h2o,oracle", "--methods"),
    budget: int = typer.Option(128, "--budget"),
    windows: str = typer.Option("1,2,4,8,16,32,64,128", "--windows"),
    steps: int = typer.Option(32, "--steps", help="Real decoding steps that define the reference top-K."),
    out: Path = typer.Option(Path("runs/analysis"), "--out"),
) -> None:
    """Figure 3 / Table 8: recall of the oracle top-K and distribution cosine, by window."""
    from .analysis.run import render, run_recall
    from .bench.runner import parse_budgets, parse_methods

    parse_methods(methods)
    window_list = tuple(parse_budgets(windows))
    if budget < 1 or steps < 1:
        raise ConfigError("--budget and --steps must be >= 1")
    lm, tok, sample_list, store = _analysis_setup(model, taskset, lengths, samples, seed, out, tasks)
    run_recall(lm, tok, sample_list, store, model_id=model or "smollm2-135m", methods=methods, budget=budget,
               windows=window_list, steps=steps)
    typer.echo(render(out))


@analyze_app.command("ablation")
def analyze_ablation(
    part: str = typer.Argument(..., help="a (content), b (window N) or c (insert position)."),
    model: str = _MODEL, taskset: str = _TASKSET, lengths: str = _LENGTHS, samples: int = _SAMPLES,
    seed: int = _SEED, tasks: str = _TASKS,
    budget: int = typer.Option(128, "--budget"),
    steps: int = typer.Option(32, "--steps"),
    accuracy: bool = typer.Option(True, "--accuracy/--no-accuracy", help="Also run the accuracy cells."),
    out: Path = typer.Option(Path("runs/ablation"), "--out"),
) -> None:
    """Figure 4: DapQ's content, window and position choices, as recall and as accuracy."""
    from .analysis.run import ABLATIONS, render, run_ablation
    from .bench.report import markdown, table

    if part not in ABLATIONS:
        raise ConfigError(f"ablation part must be one of {', '.join(ABLATIONS)}")
    out = out / part
    lm, tok, sample_list, _ = _analysis_setup(model, taskset, lengths, samples, seed, out, tasks)
    acc = run_ablation(lm, tok, sample_list, out, model_id=model or "smollm2-135m", part=part, budget=budget,
                       steps=steps, accuracy=accuracy)
    typer.echo(render(out))
    if acc is not None:
        typer.echo(markdown(*table(list(acc), sample_list[0].taskset)))


@app.command()
def demo(
    model: str = typer.Option(None, "--model", help="Model dir or hub id (default: embedded SmolLM2-135M)."),
    length: int = typer.Option(2000, "--length", help="Prompt length in tokens."),
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Where the demo keeps its results."),
) -> None:
    """Short NIAH comparison: FullKV, StreamingLLM, SnapKV and DapQ at budgets 64 and 128."""
    from .demo import run_demo
    from .models import load_model

    _quiet_transformers()
    lm, tokenizer = load_model(model)
    run_demo(lm, tokenizer, length=length, out=out, model_id=model or "smollm2-135m")


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "speed"]:
        # `dapq bench speed` has its own options; typer cannot mix them into the task-set command.
        argv = ["bench-speed", *argv[2:]]
    # typer has no option with an optional value: `--ray` is a flag, `--ray=ADDRESS` is --ray-address.
    if argv[:1] in (["bench"], ["generate"]):  # the commands that have --ray-address
        argv = ["--ray-address=" + a[len("--ray="):] if a.startswith("--ray=") else a for a in argv]
    try:
        app(args=argv, standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("dapq: interrupted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors: bad option, bad value, missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(0)
        print(f"dapq: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(2)
    except DapqError as exc:
        print(f"dapq: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

"""``dapq generate``: one prompt, a context with questions, or a JSONL file of requests (bulk)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import typer

from ..bulk import (
    GenerationLog,
    MethodDefaults,
    encode_requests,
    method_of_record,
    read_requests,
    result_fields,
    run_bulk,
)
from ..context import ask, compress_context
from ..errors import ConfigError, DapqError
from ..generation import SamplingConfig
from ..generation import generate as run_generate
from ..models import ModelSpec
from . import options as opt
from .app import app
from .setup import load, model_and_executor


@dataclass(frozen=True)
class _Job:
    """The options every mode of ``generate`` shares."""

    model: str | None
    defaults: MethodDefaults
    sampling: SamplingConfig
    chat: bool
    answer_prefix: str | None
    dtype: str
    device: str | None
    attn: str
    as_json: bool

    def method(self):
        """The method of ``--method`` (a name, or ``name(key=value,...)``) and its options."""
        return method_of_record({}, self.defaults)

    def load(self):
        return load(self.model, dtype=self.dtype, device=self.device, attn=self.attn)


@app.command()
def generate(
    prompt: str = typer.Option(None, "--prompt", help="Prompt text."),
    prompt_file: Path = typer.Option(None, "--prompt-file", help="Read the prompt from a file."),
    context_file: Path = typer.Option(None, "--context-file", help="Compress this context once and answer "
                                      "each --question from it (context-only compression)."),
    question: list[str] = typer.Option(None, "--question", help="A question about --context-file (repeatable)."),
    input_file: Path = typer.Option(None, "--input", help="Bulk: a JSONL file of requests (id, prompt or "
                                    "messages, optional method/budget/keep_fraction)."),
    output_file: Path = typer.Option(None, "--output", help="Bulk: the JSONL output (resumable: ids already "
                                     "there are skipped)."),
    batch_size: int = typer.Option(4, "--batch-size", help="Bulk: requests of one method generated together."),
    model: str = opt.MODEL,
    method: str = typer.Option("dapq", "--method", help="Compression method: a name, or name(key=value,...) "
                               "as in `dapq bench --methods`, e.g. 'dapq(n_pseudo=16)'."),
    budget: int = typer.Option(None, "--budget", help="Prompt tokens kept per KV head per layer."),
    keep_fraction: float = opt.KEEP_FRACTION,
    window: int = typer.Option(None, "--window", help="Observation window W (SnapKV, the variants)."),
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
    decode: str = opt.DECODE,
    dtype: str = opt.DTYPE,
    device: str = opt.DEVICE,
    attn: str = opt.ATTN,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with figures (one per question)."),
    use_ray: bool = opt.RAY,
    ray_address: str = opt.RAY_ADDRESS,
    workers: int = opt.WORKERS,
    gpus_per_worker: float = opt.GPUS,
) -> None:
    """Compress the prompt's KV cache with one method and generate (or a JSONL file of prompts: --input).

    With --context-file, only the context is compressed, once; each --question is then answered
    from the same compressed cache (the question itself is not compressed).
    """
    if keep_fraction is not None and budget is not None:
        raise ConfigError("give --budget or --keep-fraction, not both")
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, do_sample=sample, temperature=temperature,
                              top_p=top_p, seed=seed, stop=tuple(stop or ()), decode=decode)
    job = _Job(model, MethodDefaults(method=method, budget=budget, keep_fraction=keep_fraction, window=window,
                                     content=content, preset=preset),
               sampling, chat, answer_prefix, dtype, device, attn, as_json)
    ray = opt.RayOptions(use_ray, ray_address, workers, gpus_per_worker)
    if input_file is not None or output_file is not None:
        if prompt is not None or prompt_file is not None or context_file is not None or question:
            raise DapqError("give --input (bulk) or --prompt/--prompt-file/--context-file, not both")
        return _bulk(job, input_file, output_file, batch_size, ray)
    if ray.given:
        raise ConfigError("--ray, --workers and --gpus-per-worker run bulk generation (--input/--output); "
                          "one prompt runs here")
    if context_file is not None:
        if prompt is not None or prompt_file is not None:
            raise DapqError("give --context-file with --question, or --prompt/--prompt-file, not both")
        return _context(job, context_file, question or [])
    if question:
        raise DapqError("--question needs --context-file (or put the question in the prompt)")
    return _prompt(job, opt.read_prompt(prompt, prompt_file))


def _prompt(job: _Job, text: str) -> None:
    """One prompt, compressed whole, then generated from."""
    method = job.method()
    lm, tokenizer = job.load()
    result = run_generate(lm, tokenizer, [text], method, job.sampling, chat=job.chat,
                          answer_prefix=job.answer_prefix)[0]
    typer.echo(json.dumps(result_fields(result, method)) if job.as_json else result.text)


def _context(job: _Job, context_file: Path, questions: list[str]) -> None:
    """A context compressed once; each question answered from it, uncompressed after it."""
    asked = [q for q in questions if q.strip()]
    if not asked or len(asked) != len(questions):
        raise DapqError("--context-file needs at least one non-empty --question")
    method = job.method()
    text = opt.read_text(context_file, "context")
    lm, tokenizer = job.load()
    ctx = compress_context(lm, tokenizer, [text], method, chat=job.chat)
    results = ask(lm, tokenizer, ctx, asked, answer_prefix=job.answer_prefix, sampling=job.sampling)
    for i, (q, result) in enumerate(zip(asked, results, strict=True)):
        if job.as_json:
            typer.echo(json.dumps({"question": q, **result_fields(result, method)}))
        elif len(asked) == 1:
            typer.echo(result.text)
        else:
            typer.echo(f"{'' if i == 0 else chr(10)}[{i + 1}] {q}\n{result.text}")


def _bulk(job: _Job, input_file: Path | None, output_file: Path | None, batch_size: int, ray) -> None:
    """``--input prompts.jsonl --output out.jsonl``: every request, resumable, locally or on Ray."""
    if input_file is None or output_file is None:
        raise DapqError("bulk generation needs both --input and --output")
    if batch_size < 1:
        raise ConfigError("--batch-size must be >= 1")
    if output_file.exists() and input_file.exists() and output_file.resolve() == input_file.resolve():
        raise DapqError("--output must not be the --input file")
    requests = read_requests(input_file, job.defaults)  # every bad line fails here, before any loading
    log = GenerationLog(output_file)  # a second writer, or a foreign file, fails here
    spec = ModelSpec(job.model, dtype=job.dtype, device=job.device, attn_implementation=job.attn)
    with model_and_executor(spec, ray) as setup:
        requests = encode_requests(requests, setup.tokenizer, input_file, chat=job.chat,
                                   answer_prefix=job.answer_prefix, max_context=setup.max_context,
                                   max_new_tokens=job.sampling.max_new_tokens)
        done = sum(r.id in log for r in requests)
        written = run_bulk(setup.executor, requests, log, sampling=job.sampling, batch_size=batch_size,
                           run={"model": job.model or opt.DEFAULT_MODEL_ID, **setup.precision})
    typer.echo(f"{written} generated, {done} already in {output_file}", err=True)

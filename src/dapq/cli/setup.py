"""Loading the model and choosing the executor: the one set-up every command shares."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from ..errors import ConfigError, DapqError
from ..models import ModelSpec, load_model, random_model
from ..runs.executor import Executor, LocalExecutor
from .options import RayOptions


def quiet_transformers() -> None:
    """No warnings or download bars from transformers: the CLI prints only its own lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load(model: str | None, *, random_weights: str | None = None, dtype: str = "float32", device: str | None = None,
         attn: str = "sdpa"):
    """``(model, tokenizer)``: a model directory or hub id, or a random-weight shipped shape (no tokenizer)."""
    if model is not None and random_weights is not None:
        raise ConfigError("give --model or --random-weights, not both")
    quiet_transformers()
    if random_weights is not None:
        return random_model(random_weights, dtype=dtype, device=device, attn_implementation=attn), None
    return load_model(model, dtype=dtype, device=device, attn_implementation=attn)


def ray_executor(spec: ModelSpec, ray: RayOptions):
    """A :class:`~dapq.integrations.ray.RayExecutor` for --ray, or None for the local runner."""
    if not ray.wanted:
        if ray.given:
            raise ConfigError("--workers and --gpus-per-worker need --ray")
        return None
    if ray.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {ray.workers}")
    try:
        # Imported only for --ray: a user without Ray never pays for it.
        from ..integrations.ray import RayExecutor
    except ImportError:
        raise DapqError("--ray needs Ray: pip install 'dapq[ray]'") from None
    return RayExecutor(spec, workers=ray.workers, gpus_per_worker=ray.gpus, address=ray.address)


@dataclass
class Setup:
    """What a command runs units with: the model (None on a Ray driver), its tokenizer and config."""

    model: object
    tokenizer: object
    config: object
    executor: Executor

    @property
    def max_context(self) -> int | None:
        return getattr(self.config, "max_position_embeddings", None)

    @property
    def precision(self) -> dict:
        """The dtype and device type the units run in (a Ray executor's spec says what its workers got)."""
        if self.model is not None:
            return {"dtype": str(self.model.dtype).removeprefix("torch."), "device": self.model.device.type}
        spec = self.executor.spec
        return {"dtype": spec.dtype, "device": (spec.device or "auto").split(":")[0]}


@contextmanager
def model_and_executor(spec: ModelSpec, ray: RayOptions) -> Iterator[Setup]:
    """The loaded model and a local executor, or, with --ray, the tokenizer and the Ray executor.

    With Ray the driver only tokenises, schedules and writes: the weights load on the workers.
    """
    quiet_transformers()
    executor = ray_executor(spec, ray)
    with executor or nullcontext():
        if executor is None:
            lm, tokenizer = spec.load()
            yield Setup(lm, tokenizer, lm.config, LocalExecutor(lm, tokenizer))
        else:
            tokenizer, config = spec.load_tokenizer_and_config()
            yield Setup(None, tokenizer, config, executor)

"""Options and input readers shared by the commands, declared once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from ..errors import ConfigError, DapqError

DEFAULT_MODEL_ID = "smollm2-135m"

MODEL = typer.Option(None, "--model", help="Model dir or hub id (default: embedded SmolLM2-135M).")
DTYPE = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16.")
DEVICE = typer.Option(None, "--device", help="cpu or cuda (default: cuda if available).")
ATTN = typer.Option("sdpa", "--attn", help="Attention implementation: sdpa, eager, or a flash_attention_* "
                    "this transformers offers (CUDA).")
DECODE = typer.Option("auto", "--decode", help="How the decode stores new keys and values: static (buffers "
                      "written in place; auto), graph (fixed shapes, a CUDA graph on CUDA) or eager (a "
                      "torch.cat per step). The tokens are the same.")
KEEP_FRACTION = typer.Option(None, "--keep-fraction", help="Fraction of the prompt kept, in (0, 1) (kvpress's "
                             "compression_ratio is 1 - this).")
RAY = typer.Option(False, "--ray", help="Run on Ray: a local Ray, or the cluster of --ray-address "
                   "(--ray=ADDRESS works too). Needs pip install 'dapq[ray]'.")
RAY_ADDRESS = typer.Option(None, "--ray-address", help="Join this running Ray cluster (auto, host:6379, "
                           "ray://host:10001); implies --ray.")
WORKERS = typer.Option(1, "--workers", help="Ray actors, one model each (with --ray).")
GPUS = typer.Option(None, "--gpus-per-worker", help="GPUs per Ray actor (default 1 where the cluster has "
                    "GPUs, else 0).")


@dataclass(frozen=True)
class RayOptions:
    """``--ray``, ``--ray-address``, ``--workers``, ``--gpus-per-worker`` as given."""

    use_ray: bool = False
    address: str | None = None
    workers: int = 1
    gpus: float | None = None

    @property
    def wanted(self) -> bool:
        return self.use_ray or self.address is not None

    @property
    def given(self) -> bool:
        """Whether any of the four options was set."""
        return self.wanted or self.workers != 1 or self.gpus is not None


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file's content, or one line saying why it cannot be read."""
    if path.is_dir():
        raise DapqError(f"{path}: is a directory, not a {what} file")
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


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """``--prompt`` or the text of ``--prompt-file`` (exactly one of them)."""
    if (prompt is None) == (prompt_file is None):
        raise DapqError("give exactly one of --prompt and --prompt-file")
    if prompt_file is not None:
        return read_text(prompt_file, "prompt")
    if not prompt.strip():
        raise DapqError("the prompt is empty")
    return prompt


def int_list(text: str, what: str, minimum: int = 1) -> tuple[int, ...]:
    """``64,128`` as integers >= ``minimum``, or one line naming the option."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{what} must be a comma list of integers, got {text!r}") from None
    if not values or min(values) < minimum:
        raise ConfigError(f"{what} must be integers >= {minimum}, got {text!r}")
    return values

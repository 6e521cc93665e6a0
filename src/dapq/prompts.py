"""Prompts as token ids: plain text, a chat turn, or a context and a question split around one.

A leaf module (tokenizers only, no model): the generate APIs, the context mode, the task sets and
the analyses all encode prompts here, so none of them imports another to do it.

Context-only compression splits the chat template's user turn: the context part is the template's
opening plus the context, the question part the question, the template's closing and generation
prompt, and the answer prefix. The split is taken at a separator rendered inside the user message,
so it holds for any template that copies the message verbatim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import DapqError


def encode_prompts(
    tokenizer, prompts: Sequence[str], *, chat: bool = False, answer_prefix: str | None = None
) -> list[list[int]]:
    """Token ids of each prompt; ``chat`` wraps it as one user turn with the chat template."""
    rows = []
    for prompt in prompts:
        if chat:
            if not getattr(tokenizer, "chat_template", None):
                raise DapqError("--chat needs a tokenizer with a chat template")
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            text += answer_prefix or ""
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(prompt + (answer_prefix or ""))["input_ids"]
        if not ids:
            raise DapqError("a prompt tokenizes to nothing")
        rows.append(list(ids))
    return rows


def pad_token_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


def eos_token_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update([source] if isinstance(source, int) else source)
    return ids


@dataclass(frozen=True)
class ChatSplit:
    """The two sides of a chat user turn around its content: ``opening + content + closing``."""

    opening: str
    closing: str

    @classmethod
    def of(cls, tokenizer) -> ChatSplit:
        if not getattr(tokenizer, "chat_template", None):
            raise DapqError("chat mode needs a tokenizer with a chat template")
        probe = "dapq context"
        # A separator that cannot occur inside the probe content marks where the content ends.
        separator = "#" * (len(probe) + 16)
        text = tokenizer.apply_chat_template([{"role": "user", "content": probe + separator}],
                                             add_generation_prompt=True, tokenize=False)
        parts = text.split(separator)
        if len(parts) != 2 or not parts[0].endswith(probe):
            raise DapqError("the chat template does not copy the user message verbatim; use chat=False")
        head, closing = parts
        return cls(opening=head[: -len(probe)], closing=closing)


def encode_context(tokenizer, context: str, *, chat: bool) -> list[int]:
    """Token ids of a context: the chat template's opening plus the context, or the plain text."""
    if chat:
        ids = tokenizer(ChatSplit.of(tokenizer).opening + context, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(context)["input_ids"]
    if not ids:
        raise DapqError("a context tokenizes to nothing")
    return list(ids)


def encode_question(tokenizer, question: str, *, chat: bool, answer_prefix: str | None = None) -> list[int]:
    """Token ids of a question: the question, the chat template's closing, then the answer prefix."""
    text = question + (ChatSplit.of(tokenizer).closing if chat else "") + (answer_prefix or "")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise DapqError("a question tokenizes to nothing")
    return list(ids)

"""Needle-in-a-haystack prompts (RULER's single-needle form) built to a target token length.

The needle is RULER's "One of the special magic numbers for {key} is: {value}." hidden at a
given depth of a haystack; the question asks for the value and the answer prefix is given, so a
correct answer is the 7-digit number. Prompts are deterministic for a seed and are sized with
the model's own tokenizer.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from ..errors import DapqError

# RULER's "noise" haystack: repeated filler that carries no information.
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
ANSWER_PREFIX = " The special magic number for {key} mentioned in the provided text is"
_WORDS = (
    "amber bold brisk calm cedar clever coral crisp dusty eager fancy gentle hollow ivory jolly "
    "lively mellow misty noble olive plucky quiet rapid rustic shiny silent sleepy smoky snowy "
    "spicy sunny tidy vivid wild witty"
).split()
_NOUNS = "owl fox badger heron otter lynx raven sparrow walrus panda falcon beetle moose gecko".split()


@dataclass(frozen=True)
class NeedleSample:
    """One prompt with its reference answer."""

    sample_id: str
    prompt: str
    answer_prefix: str
    reference: str
    length: int
    depth: float


def _sentences(haystack: str) -> list[str]:
    return [s + " " for s in re.split(r"(?<=[.!?])\s+", haystack.strip()) if s]


def make_needle_prompt(
    tokenizer, length: int, depth: float, *, seed: int = 0, haystack: str = NOISE, chat: bool = True
) -> NeedleSample:
    """A NIAH prompt of about ``length`` tokens as the model sees it.

    Parameters
    ----------
    length : int
        Target length in tokens of the encoded prompt (chat template and answer prefix included
        when ``chat``), met to within one haystack sentence.
    depth : float
        Needle position as a fraction of the haystack, 0 (start) to 1 (end).
    seed : int
        Picks the key and the 7-digit value.
    """
    from ..generation import encode_prompts

    rng = random.Random(f"{seed}-{length}-{depth}")
    key = f"{rng.choice(_WORDS)}-{rng.choice(_NOUNS)}"
    value = str(rng.randint(1_000_000, 9_999_999))
    needle = f"One of the special magic numbers for {key} is: {value}. "
    question = "\n" + QUESTION.format(key=key)
    prefix = ANSWER_PREFIX.format(key=key)
    sentences = _sentences(haystack)

    def build(n: int) -> str:
        body = [sentences[i % len(sentences)] for i in range(n)]
        body.insert(round(depth * n), needle)
        return "".join(body) + question

    def size(n: int) -> int:
        return len(encode_prompts(tokenizer, [build(n)], chat=chat, answer_prefix=prefix)[0])

    # Largest sentence count that fits: tokenise the real prompt, since BPE merges across
    # sentence boundaries make per-sentence counts drift.
    if size(0) > length:
        raise DapqError(f"a needle prompt needs more than {length} tokens")
    lo, hi = 0, 1
    while size(hi) <= length:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if size(mid) <= length else (lo, mid)
    return NeedleSample(
        sample_id=f"niah-{length}-{depth:.2f}-s{seed}",
        prompt=build(lo),
        answer_prefix=prefix,
        reference=value,
        length=length,
        depth=depth,
    )


def exact_number_match(prediction: str, reference: str) -> float:
    """1.0 when the first number in the prediction is the reference number."""
    found = re.findall(r"\d+", prediction.replace(",", ""))
    return float(bool(found) and found[0] == reference)

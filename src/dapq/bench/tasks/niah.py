"""Needle in a haystack (RULER's single-needle form) on a grid of lengths x depths.

The needle is RULER's "One of the special magic numbers for {key} is: {value}." (exact-number
scoring), or a sentence needle scored by ROUGE-1 recall. It is hidden at a given depth of a
haystack of real prose (``src/dapq/data``) or RULER's noise filler; the question asks for it and
the answer prefix is given. Prompts are deterministic for a seed and sized with the model's own
tokenizer, chat template included.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .. import metrics
from .base import Sample, TaskArgs, fit_to_length, select_tasks, taskset
from .haystack import NOISE, haystack_text, sentences
from .words import ADJECTIVES, NOUNS

QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
ANSWER_PREFIX = " The special magic number for {key} mentioned in the provided text is"
SENTENCE_NEEDLES = (
    "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.",
    "The secret ingredient of the village soup was a spoonful of smoked paprika added at the very end.",
    "The old clock in the station tower was repaired by a retired sailor who refused any payment.",
)


@dataclass(frozen=True)
class NeedleSample:
    """One prompt with its reference answer."""

    sample_id: str
    prompt: str
    answer_prefix: str
    reference: str
    length: int
    depth: float
    context_end: int
    """Where the haystack ends and the question begins (``Sample.context_end``)."""


def make_needle_prompt(
    tokenizer, length: int, depth: float, *, seed: int = 0, haystack: str = NOISE, chat: bool = True,
    sentence_needle: bool = False,
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
        Picks the key and the 7-digit value (or the sentence needle).
    haystack : str
        The haystack text, cycled sentence by sentence.
    sentence_needle : bool
        Hide a sentence and ask for it, instead of a number.
    """
    rng = random.Random(f"{seed}-{length}-{depth}")
    key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    if sentence_needle:
        value = rng.choice(SENTENCE_NEEDLES)
        needle = value + " "
        question = "\nWhat is the sentence about a special fact mentioned in the provided text? Repeat it exactly."
        prefix = " The sentence is:"
    else:
        value = str(rng.randint(1_000_000, 9_999_999))
        needle = f"One of the special magic numbers for {key} is: {value}. "
        question = "\n" + QUESTION.format(key=key)
        prefix = ANSWER_PREFIX.format(key=key)
    units = sentences(haystack)

    def build(n: int) -> tuple[str, str, int]:
        body = [units[i % len(units)] for i in range(n)]
        body.insert(round(depth * n), needle)
        haystack = "".join(body)
        return haystack + question, prefix, len(haystack)

    prompt, _, context_end = build(fit_to_length(tokenizer, build, length, chat=chat))
    return NeedleSample(sample_id=f"niah-{length}-{depth:.2f}-s{seed}", prompt=prompt, answer_prefix=prefix,
                        reference=value, length=length, depth=depth, context_end=context_end)


@taskset("niah")
def niah_samples(tokenizer, args: TaskArgs) -> list[Sample]:
    """lengths x depths x samples needle prompts.

    ``--tasks number`` (default) hides a 7-digit number (task ``niah``, exact match);
    ``--tasks sentence`` hides a sentence (task ``niah_sentence``, ROUGE-1 recall).
    """
    text = haystack_text(args.haystack)
    kinds = select_tasks(TaskArgs(tasks=args.tasks or ("number",)), ("number", "sentence"), "niah needle")
    out = []
    for kind in kinds:
        task = "niah" if kind == "number" else "niah_sentence"
        for length in args.lengths or (4000,):
            for depth in args.depths:
                for i in range(args.samples):
                    s = make_needle_prompt(tokenizer, length, depth, seed=args.seed * 1000 + i, haystack=text,
                                           sentence_needle=kind == "sentence")
                    out.append(Sample(
                        taskset="niah", task=task, sample_id=f"{task}-{s.sample_id}-{args.haystack}",
                        prompt=s.prompt, references=(s.reference,),
                        metric="exact_number" if kind == "number" else "rouge1_recall",
                        answer_prefix=s.answer_prefix, max_new_tokens=16 if kind == "number" else 40,
                        context_end=s.context_end,
                        meta={"length": length, "depth": depth, "haystack": args.haystack},
                    ))
    return out


def exact_number_match(prediction: str, reference: str) -> float:
    """1.0 when the first number in the prediction is the reference number."""
    return metrics.exact_number_match(prediction, [reference])

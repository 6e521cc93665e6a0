"""The 11 synthetic RULER tasks of the DapQ paper's Tables 11-13, generated locally.

Hsieh et al., "RULER: What's the Real Context Size of Your Long-Context Language Models?"
(arXiv 2404.06654). The task definitions, templates and needle/haystack types follow RULER's
``synthetic.yaml``; every prompt is sized to the target length with the model's tokenizer and
scored with ``string_match_all`` as in RULER. Deviations: the essay haystack is the prose shipped
in ``src/dapq/data`` (RULER uses Paul Graham's essays), the word lists are this project's, the
CWE task has no in-context example, and generation lengths are shortened where the answer fits
(a 135M model rambles; the metric only looks for the references).
"""

from __future__ import annotations

import random
import string
import uuid
from dataclasses import dataclass

from ...errors import DapqError
from .base import Sample, TaskArgs, fill, fit_to_length, select_tasks, taskset
from .haystack import haystack_text, sentences
from .words import ADJECTIVES, COMMON, NOUNS

NIAH_TEMPLATE = (
    "Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_v} afterwards.\n{context}\n"
    "What are all the special magic {type_v} for {query} mentioned in the provided text?"
)
NIAH_PREFIX = " The special magic {type_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_v} for {key} is: {value}. "

VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {n} variables are "
    "assigned the value {query}, they are: "
)
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\n"
    "Question: What are the 10 most common words in the above list?"
)
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please "
    "ignore the dots '....'. What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"


@dataclass(frozen=True)
class NiahSpec:
    haystack: str  # noise | essay | needle
    key_type: str  # words | uuids
    value_type: str  # numbers | uuids
    num_keys: int = 1
    num_values: int = 1
    num_queries: int = 1
    max_new_tokens: int = 32


NIAH_TASKS = {
    "niah_single_1": NiahSpec("noise", "words", "numbers"),
    "niah_single_2": NiahSpec("essay", "words", "numbers"),
    "niah_single_3": NiahSpec("essay", "words", "uuids", max_new_tokens=64),
    "niah_multikey_1": NiahSpec("essay", "words", "numbers", num_keys=4),
    "niah_multikey_2": NiahSpec("needle", "words", "numbers"),
    "niah_multikey_3": NiahSpec("needle", "uuids", "uuids", max_new_tokens=64),
    "niah_multivalue": NiahSpec("essay", "words", "numbers", num_values=4, max_new_tokens=64),
    "niah_multiquery": NiahSpec("essay", "words", "numbers", num_keys=4, num_queries=4, max_new_tokens=64),
}
OTHER_TASKS = ("vt", "cwe", "fwe")
TASKS = (*NIAH_TASKS, *OTHER_TASKS)


def _key(rng: random.Random, kind: str) -> str:
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def _value(rng: random.Random, kind: str) -> str:
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return str(rng.randint(1_000_000, 9_999_999))


def _niah(tokenizer, spec: NiahSpec, length: int, rng: random.Random, essay: str) -> tuple[str, str, int, list[str]]:
    type_v = "numbers" if spec.value_type == "numbers" else "UUIDs"
    keys: list[str] = []
    while len(keys) < spec.num_keys:
        k = _key(rng, spec.key_type)
        if k not in keys:
            keys.append(k)
    values = {k: [_value(rng, spec.value_type) for _ in range(spec.num_values)] for k in keys}
    needles = [NEEDLE.format(type_v=type_v, key=k, value=v) for k in keys for v in values[k]]
    rng.shuffle(needles)
    queried = keys[: spec.num_queries]
    query = queried[0] if len(queried) == 1 else ", ".join(queried[:-1]) + ", and " + queried[-1]
    references = [v for k in queried for v in values[k]]
    if spec.haystack == "needle":
        # The haystack is made of distractor needles with other keys and values.
        filler = []
        while len(filler) < 4096:
            k = _key(rng, spec.key_type)
            if k not in values:
                filler.append(NEEDLE.format(type_v=type_v, key=k, value=_value(rng, spec.value_type)))
    else:
        filler = sentences(essay if spec.haystack == "essay" else haystack_text("noise"))
    spots = [rng.random() for _ in needles]

    def build(n: int) -> tuple[str, str, int]:
        body = [filler[i % len(filler)] for i in range(n)]
        for needle, spot in sorted(zip(needles, spots, strict=True), key=lambda x: -x[1]):
            body.insert(round(spot * len(body)), needle)
        prompt, context_end = fill(NIAH_TEMPLATE, "".join(body), type_v=type_v, query=query)
        return prompt, NIAH_PREFIX.format(type_v=type_v, query=query), context_end

    return *build(fit_to_length(tokenizer, build, length)), references


def _variable(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(5))


def _vt(tokenizer, length: int, rng: random.Random, hops: int = 4) -> tuple[str, str, int, list[str]]:
    names: list[str] = []
    while len(names) < hops + 1:
        v = _variable(rng)
        if v not in names:
            names.append(v)
    value = str(rng.randint(10000, 99999))
    chain = [f"VAR {names[0]} = {value}. "] + [f"VAR {names[i]} = VAR {names[i - 1]}. " for i in range(1, hops + 1)]
    noise = sentences(haystack_text("noise"))
    spots = sorted(rng.random() for _ in chain)

    def build(n: int) -> tuple[str, str, int]:
        body = [noise[i % len(noise)] for i in range(n)]
        # Insert in chain order at increasing depths, so each assignment follows the one it uses.
        for offset, (stmt, spot) in enumerate(zip(chain, spots, strict=True)):
            body.insert(round(spot * n) + offset, stmt)
        prompt, context_end = fill(VT_TEMPLATE, "".join(body), query=value)
        return prompt, VT_PREFIX.format(n=len(names), query=value), context_end

    return *build(fit_to_length(tokenizer, build, length)), names


def _cwe(tokenizer, length: int, rng: random.Random, freq_rare: int = 3, n_common: int = 10
         ) -> tuple[str, str, int, list[str]]:
    words = list(COMMON)
    rng.shuffle(words)
    common, rare_pool = words[:n_common], words[n_common:]
    order_seed = rng.random()

    def builder(freq_common: int):
        def build(n: int) -> tuple[str, str, int]:
            items = common * freq_common + [rare_pool[i % len(rare_pool)] for i in range(n)] * freq_rare
            random.Random(order_seed).shuffle(items)
            prompt, context_end = fill(CWE_TEMPLATE, " ".join(f"{i + 1}. {w}" for i, w in enumerate(items)))
            return prompt, CWE_PREFIX, context_end

        return build

    # RULER repeats each common word 30 times; short contexts (or verbose tokenizers) that cannot
    # hold that many get fewer repetitions, always well above the rare words' 3.
    for freq_common in (30, 20, 12, 8):
        build = builder(freq_common)
        try:
            n = fit_to_length(tokenizer, build, length)
        except DapqError:
            continue
        prompt, prefix, context_end = build(min(n, len(rare_pool)))
        return prompt, prefix, context_end, common
    raise DapqError(f"CWE needs more than {length} tokens")


def _fwe(tokenizer, length: int, rng: random.Random, alpha: float = 2.0) -> tuple[str, str, int, list[str]]:
    vocab = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6))) for _ in range(2000)]
    vocab = list(dict.fromkeys(vocab))
    # Zipf weights: word rank r has weight 1 / r^alpha; the three most frequent are the answer.
    weights = [1 / (r + 1) ** alpha for r in range(len(vocab))]
    draw_seed = rng.random()

    def build(n: int) -> tuple[str, str, int]:
        draw = random.Random(draw_seed).choices(vocab, weights=weights, k=n)
        prompt, context_end = fill(FWE_TEMPLATE, " .... ".join(draw))
        return prompt, FWE_PREFIX, context_end

    n = fit_to_length(tokenizer, build, length)
    prompt, prefix, context_end = build(n)
    counts: dict[str, int] = {}
    for w in random.Random(draw_seed).choices(vocab, weights=weights, k=n):
        counts[w] = counts.get(w, 0) + 1
    top = sorted(counts, key=lambda w: -counts[w])[:3]
    return prompt, prefix, context_end, top


@taskset("ruler")
def ruler_samples(tokenizer, args: TaskArgs) -> list[Sample]:
    """``args.samples`` prompts per task and length for the 11 RULER tasks (or ``--tasks``)."""
    tasks = select_tasks(args, TASKS, "RULER")
    essay = haystack_text(args.haystack if args.haystack != "noise" else "essays")
    out = []
    for task in tasks:
        for length in args.lengths or (4000,):
            for i in range(args.samples):
                rng = random.Random(f"ruler-{task}-{length}-{args.seed}-{i}")
                if task in NIAH_TASKS:
                    spec = NIAH_TASKS[task]
                    prompt, prefix, context_end, refs = _niah(tokenizer, spec, length, rng, essay)
                    max_new = spec.max_new_tokens
                elif task == "vt":
                    prompt, prefix, context_end, refs = _vt(tokenizer, length, rng)
                    max_new = 30
                elif task == "cwe":
                    prompt, prefix, context_end, refs = _cwe(tokenizer, length, rng)
                    max_new = 80
                else:
                    prompt, prefix, context_end, refs = _fwe(tokenizer, length, rng)
                    max_new = 40
                out.append(Sample(
                    taskset="ruler", task=task, sample_id=f"ruler-{task}-{length}-s{args.seed}-{i}",
                    prompt=prompt, references=tuple(refs), metric="string_match_all", answer_prefix=prefix,
                    max_new_tokens=max_new, context_end=context_end,
                    meta={"length": length, "haystack": args.haystack},
                ))
    return out

"""HELMET's 11 sub-tasks of the DapQ paper's Table 14, as HELMET itself builds and scores them.

Yen et al., "HELMET: How to Evaluate Long-Context Language Models Effectively and Thoroughly"
(arXiv 2410.02694), code at princeton-nlp/HELMET. What follows HELMET, and from where:

- Templates (``data.py``): each task's user template, and its system template ("Answer:" or
  "label:"). Without the chat template the prompt is ``user + "\\n" + system``; with it the
  user template is the only (user) turn and the model answers after the generation prompt.
- Settings (``configs/icl.yaml``, ``rag.yaml``, ``longqa.yaml`` and their ``_short`` variants):
  generation lengths (ICL 20, RAG 20, NarrativeQA 100, InfiniteBench QA 10), chat template
  (LongQA only), newline stopping (ICL, RAG), 2 demonstrations (RAG, LongQA), test-set sizes
  (ICL 500, the others 100), seed 42, and the data sizes per input length: ICL shots and the
  RAG files' passage counts for 8k, 16k, 32k, 64k and 128k tokens. dapq takes the smallest
  HELMET length >= the target length (``--lengths``, default the model's context) and, like
  HELMET's ``tokenize`` (``model_utils.py``), cuts the end of the context (the documents, the
  story, the many-shot demonstrations) until the prompt fits the length less the generation.
- Demonstrations and test subsets (``data.py``): RAG demos drawn per question with a
  sha256-seeded shuffle and de-duplication (PopQA's from its own test file minus the question,
  after the popularity filter ``log10(s_pop) < 3``), the 100 test questions drawn with
  ``random.seed(42)``; ICL's label-balanced many-shot demos per test text, labels mapped to a
  shuffled integer per test text, the 500 label-balanced test texts; InfiniteBench's demos and
  order from ``shuffle(seed=42)``; NarrativeQA's order from ``shuffle(seed=42)``. ``datasets``'
  ``shuffle(seed)`` is ``numpy.random.default_rng(seed).permutation``, so dapq draws the same
  items without ``datasets``. ``--samples N`` takes the first N of HELMET's test subset.
- Scoring (``utils.py`` ``calculate_metrics`` / ``parse_output``, ``data.py`` post-processing,
  ``eval.py``): see :mod:`dapq.bench.metrics`. Columns as in HELMET's ``collect_results.py``:
  ICL exact match, RAG substring exact match, InfiniteBench QA ROUGE-L F1; NarrativeQA is also
  scored by ROUGE-L F1 (HELMET's own leaderboard column for it is a GPT-4 judge).

Where dapq cannot follow HELMET: NarrativeQA's two demonstrations come from an unseeded
shuffle in HELMET (different every run), so dapq draws them with a seed per question; HELMET's
filters that keep only stories longer than 65k/131k Llama-2 tokens and its Llama-2-token
pre-truncation of LongQA stories need the Llama-2 tokenizer, so dapq does not apply them (at
dapq's lengths the end-of-context cut above is what shortens the stories anyway).

Data layout of ``--data DIR`` (HELMET's ``data/`` folder, or the folder above it):

- RAG, from HELMET's ``scripts/download_data.sh`` (``data.tar.gz``), under their own names:
  ``kilt/{nq,triviaqa}-dev-multikilt_1000_k{K}_dep6.jsonl``,
  ``kilt/hotpotqa-dev-multikilt_1000_k{K}_dep3.jsonl``, ``kilt/popqa_test_1000_k{K}_dep6.jsonl``
  with K = 50, 105, 220, 440, 1000 for 8k..128k; demos ``kilt/{nq,triviaqa}-train-multikilt_1000_k3_dep6.jsonl``,
  ``kilt/hotpotqa-train-multikilt_1000_k3_dep3.jsonl``, ``kilt/popqa_test_1000_k3_dep6.jsonl``.
  Rows: ``question``, ``answers`` (list), ``ctxs`` (list of ``{title, text}``), optional ``id``,
  ``s_pop`` (PopQA).
- ICL and LongQA, which HELMET loads from the Hugging Face hub: a JSON-lines export of each
  split, ``hf/<dataset id>[/<config>]/<split>.jsonl``, as ``datasets`` writes it with
  ``load_dataset(id, config, split=split).to_json(path)``:
  ``hf/CogComp/trec/{train,test}.jsonl`` (``text``, ``coarse_label``, ``fine_label``),
  ``hf/PolyAI/banking77/{train,test}.jsonl`` (``text``, ``label``),
  ``hf/clinc_oos/plus/{train,validation}.jsonl`` (``text``, ``intent``),
  ``hf/xingkunliuxtracta/nlu_evaluation_data/train.jsonl`` (``text``, ``label``; HELMET splits
  it 90/10 with seed 42), ``hf/narrativeqa/{train,test}.jsonl`` (``document.text``,
  ``question.text``, ``answers[].text``; the train file needs no documents),
  ``hf/xinrongzhang2022/infinitebench/longbook_qa_eng.jsonl`` (``id``, ``context``, ``input``,
  ``answer``).

``--data hub`` loads the ICL and LongQA sources from the hub through ``datasets``; HELMET's RAG
files exist only in its ``data.tar.gz``, so the ``kilt_*`` tasks need ``--data DIR``.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import DapqError
from ...prompts import encode_prompts
from .base import Sample, TaskArgs, fill, select_tasks, taskset
from .files import data_root, hub_rows, locate, read_jsonl, require, require_list

SEED = 42  # HELMET's arguments.py default
LENGTHS = (8192, 16384, 32768, 65536, 131072)  # HELMET's input lengths (configs/*_short.yaml, *.yaml)

# ---- templates, data.py of princeton-nlp/HELMET (load_qa, load_icl, load_narrativeqa, load_infbench)
RAG_USER = ("Use the given documents to write a concise and short answer to the question. Write your answer in the "
            "following format:\nAnswer: [answer]\n\n{demos}{context}\n\nQuestion: {question}")
RAG_DEMO = "{documents}\n\nQuestion: {question}\nAnswer: {answer}"
PASSAGE = "Document (Title: {title}): {text}"
ICL_USER = ("Use the provided mapping from the text to label to assign a label to the text. Only output "
            "\"label: {{label}}\" and nothing else. \n\n{context}\n\n{question}")
ICL_ITEM = "{text}\nlabel: {label}"
NARRATIVEQA_USER = ("You are given a story, which can be either a novel or a movie script, and a question. Answer "
                    "the question as concisely as you can, using a single phrase if possible.\n\n{demo}{context}\n\n"
                    "Question: {question}")
NARRATIVEQA_DEMO = ("For example:\n\n{examples}\n\nNow, use the following story to answer the question:\n\n",
                    "Question: {question}\nAnswer: {answer}")
INFBENCH_USER = ("You are given a story and a question. Answer the question as concisely as you can, using a single "
                 "phrase if possible.\n\n{demo}{context}\n\nQuestion: {question}")
INFBENCH_DEMO = ("For example:\n\n{examples}\n\nNow, read the following story:\n\n",
                 "[story text]\nQuestion: {question}\nAnswer: {answer}")


@dataclass(frozen=True)
class HelmetTask:
    """One sub-task: its kind, metric and the settings of its HELMET config."""

    kind: str  # "icl", "rag" or "longqa"
    metric: str
    max_new_tokens: int
    chat: bool
    stop_newline: bool
    max_test_samples: int
    system: str = "Answer:"


_ICL = HelmetTask("icl", "exact_match", 20, chat=False, stop_newline=True, max_test_samples=500, system="label:")
_RAG = HelmetTask("rag", "substring_exact_match", 20, chat=False, stop_newline=True, max_test_samples=100)
# Table 14's column order.
TASKS: dict[str, HelmetTask] = {
    "icl_banking77": _ICL, "icl_clinic150": _ICL, "icl_nlu": _ICL, "icl_trec_coarse": _ICL, "icl_trec_fine": _ICL,
    "narrativeqa": HelmetTask("longqa", "rougeL_f1", 100, chat=True, stop_newline=False, max_test_samples=100),
    "infbench_qa_eng": HelmetTask("longqa", "rougeL_f1", 10, chat=True, stop_newline=False, max_test_samples=100),
    "kilt_hotpotqa": _RAG, "kilt_nq": _RAG, "kilt_popqa_3": _RAG, "kilt_triviaqa": _RAG,
}


@dataclass(frozen=True)
class IclSource:
    """Where an ICL task's texts come from (load_icl) and its many-shot counts per length."""

    repo: str
    config: str | None
    train: str
    test: str | None  # None: HELMET splits the train split 90/10 (NLU)
    label: str
    num_labels: int
    shots: tuple[int, ...]  # per LENGTHS (configs/icl_short.yaml, icl.yaml)


ICL_SOURCES = {
    "icl_trec_coarse": IclSource("CogComp/trec", None, "train", "test", "coarse_label", 6, (400, 800, 1600, 3300, 6600)),
    "icl_trec_fine": IclSource("CogComp/trec", None, "train", "test", "fine_label", 50, (400, 800, 1600, 3200, 6400)),
    "icl_banking77": IclSource("PolyAI/banking77", None, "train", "test", "label", 77, (360, 720, 1450, 2900, 5900)),
    "icl_clinic150": IclSource("clinc_oos", "plus", "train", "validation", "intent", 151,
                               (440, 880, 1750, 3525, 7050)),
    "icl_nlu": IclSource("xingkunliuxtracta/nlu_evaluation_data", None, "train", None, "label", 68,
                         (510, 1020, 2040, 4080, 8296)),
}
# RAG: (file stem, depth tag); K passages per LENGTHS (configs/rag_short.yaml, rag.yaml).
KILT = {"kilt_nq": ("nq", 6), "kilt_triviaqa": ("triviaqa", 6), "kilt_hotpotqa": ("hotpotqa", 3), "kilt_popqa_3": ("popqa", 6)}
KILT_PASSAGES = (50, 105, 220, 440, 1000)
POPQA_THRESHOLD = 3.0  # the "3" of kilt_popqa_3: log10 popularity below it


def _size_index(length: int) -> int:
    """The smallest HELMET input length that holds ``length`` tokens (the largest beyond 128k)."""
    return next((i for i, n in enumerate(LENGTHS) if length <= n), len(LENGTHS) - 1)


def _sha_seed(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16)


def _permutation(n: int, seed: int) -> list[int]:
    # datasets' Dataset.shuffle(seed=s) selects rows in numpy.random.default_rng(s).permutation(n) order.
    return [int(i) for i in np.random.default_rng(seed).permutation(n)]


# --------------------------------------------------------------------------- prompt assembly
def _render(user: str, fields: dict, task: HelmetTask) -> tuple[str, int]:
    """The prompt (user template, plus "\\n" + system template without chat) and its context end."""
    prompt, context_end = fill(user, **fields)
    if not task.chat:
        prompt += "\n" + task.system
    return prompt, context_end


def _drop_last_tokens(tokenizer, text: str, n: int) -> str:
    """``text`` without its last ``n`` tokens, cut at a character offset as HELMET's ``tokenize`` does."""
    if getattr(tokenizer, "is_fast", False):
        offsets = tokenizer([text], return_offsets_mapping=True)["offset_mapping"][0]
        return "" if n >= len(offsets) else text[: offsets[-n][0]]
    ids = tokenizer(text)["input_ids"]  # HELMET's path for slow tokenizers: decode the kept ids
    return "" if n >= len(ids) else tokenizer.decode(ids[:-n], skip_special_tokens=True)


def _fit(tokenizer, name: str, user: str, fields: dict, task: HelmetTask, limit: int) -> tuple[str, int]:
    """HELMET's truncation: cut the context's end by the prompt's excess over ``limit`` tokens, once.

    The excess is counted on the whole prompt and cut from the context tokenised alone, so the
    re-tokenised prompt can keep a token or two of excess, as it does in HELMET (the runner's
    64-token margin absorbs it).
    """
    fields = dict(fields)
    prompt, context_end = _render(user, fields, task)
    excess = len(encode_prompts(tokenizer, [prompt], chat=task.chat)[0]) - limit
    if excess <= 0:
        return prompt, context_end
    fields["context"] = _drop_last_tokens(tokenizer, fields["context"], excess)
    prompt, context_end = _render(user, fields, task)
    if not fields["context"] and len(encode_prompts(tokenizer, [prompt], chat=task.chat)[0]) > limit:
        raise DapqError(f"HELMET {name}: the prompt does not fit {limit} tokens even without its context")
    return prompt, context_end


def _limit(args: TaskArgs, task: HelmetTask) -> tuple[int, int]:
    """(HELMET input length for data sizes, prompt token limit) for this run."""
    length = max(args.lengths) if args.lengths else (args.max_context or LENGTHS[-1])
    if args.max_context:
        length = min(length, args.max_context - 64)  # the runner keeps 64 tokens of margin
    return length, length - task.max_new_tokens


def _sample(name: str, index: object, prompt: str, context_end: int, answers, task: HelmetTask) -> Sample:
    return Sample(
        taskset="helmet", task=name, sample_id=f"helmet-{name}-{index}", prompt=prompt,
        references=tuple(str(a) for a in answers), metric=task.metric, max_new_tokens=task.max_new_tokens,
        chat=task.chat, context_end=context_end, stop=("\n",) if task.stop_newline else (),
        # eval.py puts the system template in front of a completion (no chat template) before parsing.
        metric_args={"helmet": {"system_template": task.system, "prepend": not task.chat,
                                "parsed_only": task.kind == "icl"}},
    )


# --------------------------------------------------------------------------- hub-style sources
def _split(root: Path | None, repo: str, config: str | None, split: str, what: str) -> tuple[list[dict], object]:
    """One split of a hub dataset: ``hf/<repo>[/<config>]/<split>.jsonl`` under ``root``, or the hub."""
    if root is None:
        return hub_rows(repo, config, split), f"{repo}{f' ({config})' if config else ''} {split}"
    relative = "/".join(["hf", repo, *([config] if config else []), f"{split}.jsonl"])
    path = locate(root, relative)
    return read_jsonl(path, f"{what}: a JSON-lines export of {repo} split {split}, see dapq.bench.tasks.helmet"), path


# --------------------------------------------------------------------------- ICL
def balance_labels(rows: list[dict], label: str, shots: int, seed: int) -> list[dict]:
    """HELMET's ``balance_labels``: ``shots`` rows in rounds that hold every label once, each round shuffled.

    Rows are grouped by label in order of first appearance; each label draws one row per
    round with ``random.Random(seed)``, first ``rounds % len(group)`` distinct ones (HELMET's
    expression, which is 0 when a group has exactly ``rounds`` rows), then more draws until it
    has ``rounds``.
    """
    rand = random.Random(seed)
    groups: dict[object, list[dict]] = {}
    for row in rows:
        groups.setdefault(row[label], []).append(row)
    rounds = math.ceil(shots / len(groups))
    grid: list[list[dict]] = [[] for _ in range(rounds)]
    for members in groups.values():
        picks = rand.sample(range(len(members)), rounds % len(members))
        while len(picks) < rounds:
            picks += rand.sample(range(len(members)), min(rounds - len(picks), len(members)))
        for i, pick in enumerate(picks):
            grid[i].append(members[pick])
    for group in grid:
        rand.shuffle(group)
    return [row for group in grid for row in group][:shots]


def _icl_data(root: Path | None, name: str) -> tuple[list[dict], list[dict], object]:
    """(train rows, HELMET's test rows in its order, source) of an ICL task."""
    src = ICL_SOURCES[name]
    what = f"HELMET {name}"
    train, train_source = _split(root, src.repo, src.config, src.train, what)
    _check_icl(train, src, train_source)
    if src.test is None:
        # datasets' train_test_split(test_size=0.1, seed=42): the first ceil(0.1 n) of the permutation are test.
        order = _permutation(len(train), SEED)
        n_test = math.ceil(0.1 * len(train))
        train, test = [train[i] for i in order[n_test:]], [train[i] for i in order[:n_test]]
    else:
        test, test_source = _split(root, src.repo, src.config, src.test, what)
        _check_icl(test, src, test_source)
    if len(test) > _ICL.max_test_samples:
        test = [test[i] for i in _permutation(len(test), SEED)]
        test = balance_labels(test, src.label, _ICL.max_test_samples, SEED)
    return train, test, train_source


def _check_icl(rows: list[dict], src: IclSource, source: object) -> None:
    require(rows, ("text", src.label), source, f"rows need text and an integer {src.label}")
    for number, row in enumerate(rows, start=1):
        value = row[src.label]
        if not isinstance(value, int) or not 0 <= value < src.num_labels:
            raise DapqError(f"{source}: row {number}: {src.label} must be an integer label id in "
                            f"[0, {src.num_labels}), got {value!r}")


def _icl_samples(tokenizer, name: str, root: Path | None, args: TaskArgs) -> list[Sample]:
    src, task = ICL_SOURCES[name], TASKS[name]
    length, limit = _limit(args, task)
    shots = src.shots[_size_index(length)]
    train, test, _ = _icl_data(root, name)
    out = []
    for i, row in enumerate(test[: min(args.samples, task.max_test_samples)]):
        local_seed = (_sha_seed(row["text"]) + SEED) % 2**31
        demos = balance_labels(train, src.label, shots, local_seed)
        mapping = list(range(src.num_labels))  # labels shown as shuffled integers (no natural labels)
        random.Random(local_seed).shuffle(mapping)
        context = "\n\n".join(ICL_ITEM.format(text=d["text"], label=str(mapping[d[src.label]])) for d in demos)
        prompt, context_end = _fit(tokenizer, name, ICL_USER, {"context": context, "question": row["text"]}, task,
                                   limit)
        out.append(_sample(name, i, prompt, context_end, [str(mapping[row[src.label]])], task))
    return out


# --------------------------------------------------------------------------- RAG
def _kilt_paths(root: Path, name: str, length: int) -> tuple[Path, Path]:
    stem, depth = KILT[name]
    k = KILT_PASSAGES[_size_index(length)]
    if stem == "popqa":
        test, demo = f"popqa_test_1000_k{k}_dep{depth}.jsonl", f"popqa_test_1000_k3_dep{depth}.jsonl"
    else:
        test = f"{stem}-dev-multikilt_1000_k{k}_dep{depth}.jsonl"
        demo = f"{stem}-train-multikilt_1000_k3_dep{depth}.jsonl"
    return locate(root, f"kilt/{test}"), locate(root, f"kilt/{demo}")


def _kilt_rows(path: Path, name: str, popqa: bool) -> list[dict]:
    what = f"HELMET {name}: rows with question, answers, ctxs [{{title, text}}]" + (", s_pop" if popqa else "")
    rows = require(read_jsonl(path, what), ("question", "answers", "ctxs") + (("s_pop",) if popqa else ()), path, what)
    require_list(rows, "answers", path, what)
    require_list(rows, "ctxs", path, what, nonempty=False)
    for number, row in enumerate(rows, start=1):
        require(row["ctxs"], ("title", "text"), f"{path}: row {number} ctxs", what)
    if popqa:
        try:
            rows = [r for r in rows if math.log10(r["s_pop"]) < POPQA_THRESHOLD]
        except (TypeError, ValueError):
            raise DapqError(f"{path}: s_pop must be a positive number ({what})") from None
    return rows


def _passages(ctxs: list[dict]) -> str:
    return "\n\n".join(PASSAGE.format(**c) for c in ctxs)


def _rag_samples(tokenizer, name: str, root: Path | None, args: TaskArgs) -> list[Sample]:
    if root is None:
        raise DapqError(f"HELMET {name}: its data exist only in HELMET's data.tar.gz (scripts/download_data.sh); "
                        "give --data DIR, or --tasks without the kilt_* tasks for --data hub")
    task = TASKS[name]
    popqa = name.startswith("kilt_popqa")
    length, limit = _limit(args, task)
    test_path, demo_path = _kilt_paths(root, name, length)
    rows, demos = _kilt_rows(test_path, name, popqa), _kilt_rows(demo_path, name, popqa)
    # Questions are keyed by id where the file has ids, else by question text (nq has none).
    key = "id" if any("id" in r for r in rows) else "question"
    require(rows, (key,), test_path, f"HELMET {name}: every row needs {key!r} once one row has it")
    keys = sorted({r[key] for r in rows})
    chosen = set(random.Random(SEED).sample(keys, min(task.max_test_samples, len(keys))))
    rows = [r for r in rows if r[key] in chosen]  # file order, as datasets' filter keeps it
    out = []
    for i, row in enumerate(rows[: args.samples]):
        pool = [d for d in demos if d.get(key) != row[key]] if popqa else demos
        picked, seen = [], set()
        for j in _permutation(len(pool), _sha_seed(str(row[key])) % 2**31):
            if pool[j].get(key) not in seen:  # drop_duplicates on the shuffled demos, then the first 2
                seen.add(pool[j].get(key))
                picked.append(pool[j])
            if len(picked) == 2:
                break
        if len(picked) < 2:
            raise DapqError(f"{demo_path}: HELMET {name} needs at least 2 distinct demonstrations")
        demo_text = "\n\n".join(RAG_DEMO.format(documents=_passages(d["ctxs"]), question=d["question"],
                                                answer=d["answers"][0]) for d in picked) + "\n\n"
        fields = {"demos": demo_text, "context": _passages(row["ctxs"]), "question": row["question"]}
        prompt, context_end = _fit(tokenizer, name, RAG_USER, fields, task, limit)
        out.append(_sample(name, row.get("id", i), prompt, context_end, row["answers"], task))
    return out


# --------------------------------------------------------------------------- LongQA
def _demo_block(template: tuple[str, str], examples: list[tuple[str, str]]) -> str:
    wrapper, item = template
    return wrapper.format(examples="\n\n".join(item.format(question=q, answer=a) for q, a in examples))


def _narrativeqa_samples(tokenizer, name: str, root: Path | None, args: TaskArgs) -> list[Sample]:
    task = TASKS[name]
    _, limit = _limit(args, task)
    what = "HELMET narrativeqa: rows with document.text, question.text, answers[].text"
    test, source = _split(root, "narrativeqa", None, "test", what)
    require(test, ("document.text", "question.text", "answers"), source, what)
    require_list(test, "answers", source, what)
    train, train_source = _split(root, "narrativeqa", None, "train", what)
    require(train, ("question.text", "answers"), train_source, what)
    require_list(train, "answers", train_source, what)
    order = _permutation(len(test), SEED)[: min(args.samples, task.max_test_samples)]
    out = []
    for i in order:
        row = test[i]
        question = row["question"]["text"]
        # HELMET draws these with an unseeded shuffle (a new pair each run); dapq seeds it per question.
        picks = _permutation(len(train), (_sha_seed(question) + SEED) % 2**31)[:2]
        demo = _demo_block(NARRATIVEQA_DEMO, [(train[j]["question"]["text"], train[j]["answers"][0]["text"])
                                              for j in picks])
        fields = {"demo": demo, "context": row["document"]["text"], "question": question}
        prompt, context_end = _fit(tokenizer, name, NARRATIVEQA_USER, fields, task, limit)
        out.append(_sample(name, i, prompt, context_end, [a["text"] for a in row["answers"]], task))
    return out


def _infbench_rows(root: Path | None) -> tuple[list[dict], object]:
    what = "HELMET infbench_qa_eng: rows with id, context, input, answer"
    if root is None:
        try:
            from datasets import Features, Sequence, Value
        except ImportError:
            raise DapqError("--data hub needs the `datasets` package (pip install 'dapq[hub]')") from None
        # load_infbench's schema: the raw files mix types across the InfiniteBench tasks.
        features = Features({"id": Value("int64"), "context": Value("string"), "input": Value("string"),
                             "answer": Sequence(Value("string")), "options": Sequence(Value("string"))})
        rows = hub_rows("xinrongzhang2022/infinitebench", None, "longbook_qa_eng", features=features)
        source: object = "xinrongzhang2022/infinitebench longbook_qa_eng"
    else:
        source = locate(root, "hf/xinrongzhang2022/infinitebench/longbook_qa_eng.jsonl")
        rows = read_jsonl(source, what + " (a JSON-lines export of that split)")
    rows = require(rows, ("id", "context", "input", "answer"), source, what)
    for row in rows:
        if isinstance(row["answer"], str):
            row["answer"] = [row["answer"]]
    require_list(rows, "answer", source, what)
    return rows, source


def _infbench_samples(tokenizer, name: str, root: Path | None, args: TaskArgs) -> list[Sample]:
    task = TASKS[name]
    _, limit = _limit(args, task)
    rows, source = _infbench_rows(root)
    if len(rows) < 3:
        raise DapqError(f"{source}: HELMET {name} needs at least 3 rows (2 demonstrations per question)")
    out = []
    for i in _permutation(len(rows), SEED)[: min(args.samples, task.max_test_samples)]:
        row = rows[i]
        # add_demos: the other rows, shuffle(seed=42), the first two.
        pool = [r for r in rows if r["id"] != row["id"]]
        picks = _permutation(len(pool), SEED)[:2]
        demo = _demo_block(INFBENCH_DEMO, [(pool[j]["input"], pool[j]["answer"][0]) for j in picks])
        fields = {"demo": demo, "context": row["context"], "question": row["input"]}
        prompt, context_end = _fit(tokenizer, name, INFBENCH_USER, fields, task, limit)
        out.append(_sample(name, row["id"], prompt, context_end, row["answer"], task))
    return out


BUILDERS: dict[str, Callable[..., list[Sample]]] = {
    **dict.fromkeys(ICL_SOURCES, _icl_samples), **dict.fromkeys(KILT, _rag_samples),
    "narrativeqa": _narrativeqa_samples, "infbench_qa_eng": _infbench_samples,
}


@taskset("helmet")
def helmet_samples(tokenizer, args: TaskArgs) -> list[Sample]:
    """The first ``--samples`` test items of each selected HELMET sub-task (Table 14's 11 by default)."""
    names = select_tasks(args, tuple(TASKS), "HELMET")
    root = data_root(args)
    return [s for name in names for s in BUILDERS[name](tokenizer, name, root, args)]

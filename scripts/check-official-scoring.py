"""Check dapq's LongBench / HELMET scoring and prompts against the official code itself.

    python scripts/check-official-scoring.py --longbench PATH --helmet PATH [--pairs 20000]

PATH are checkouts of THUDM/LongBench and princeton-nlp/HELMET. Their modules are imported
from there (nothing of theirs is part of dapq), with the imports they need but these checks do
not (jieba, pytrec_eval) stubbed. Needs ``fuzzywuzzy`` (LongBench's scorer) and ``datasets``
(HELMET's loaders) installed; python-Levenshtein is blocked so that fuzzywuzzy runs as
LongBench's requirements.txt installs it. Prints one line per check and exits 1 on a mismatch.

1. Metrics: random prediction/reference pairs through LongBench's ``metrics.py`` (best over
   ground truths, as ``eval.py``) and HELMET's ``calculate_metrics`` with its post-processing,
   against :func:`dapq.bench.metrics.score`.
2. Prompts: the fixtures of ``tests/bench/tasks/fixtures`` through LongBench's config files and
   HELMET's ``data.py`` loaders (hub loads served from the fixtures' ``hf/`` exports), against
   dapq's samples, untruncated.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import types
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests/bench/tasks/fixtures"
failures = 0


def report(name: str, bad: int, total: int, example=None) -> None:
    global failures
    failures += bool(bad)
    print(f"{'FAIL' if bad else 'ok  '} {name}: {bad}/{total} differ" + (f", e.g. {example!r}" if bad else ""))


def check_metrics(longbench: Path, helmet: Path, pairs: int) -> None:
    from dapq.bench.metrics import helmet_parse_output, score

    sys.path[:0] = [str(longbench / "LongBench"), str(helmet)]
    lb = __import__("metrics")
    hu = __import__("utils")
    rng = random.Random(0)
    words = ["the", "cat", "Cat", "sat", "on", "a", "mat", "mats", "running", "runs", "yes", "no", "noanswer", "Paris",
             "paris,", "France.", ".", "..", "Paragraph", "3", "7", "x", "=", "foo(1)", "#", "//", "`", "\n", "  ",
             "Individual", "location", "Other", "Other location", "Answer:", "answer:", "label:", "Label: 3"]
    text = lambda lo=0, hi=12: " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))  # noqa: E731
    classes = ["Individual", "location", "Other", "Other location", "cat"]
    official = {"qa_f1": lb.qa_f1_score, "rouge_l": lb.rouge_score, "classification": lb.classification_score,
                "count": lb.count_score, "retrieval": lb.retrieval_score, "code_sim": lb.code_sim_score}
    for name, fn in official.items():
        bad, example = 0, None
        for _ in range(pairs):
            pred = text()
            refs = ([rng.choice(classes)] if name == "classification" else
                    [f"Paragraph {rng.randint(1, 9)}"] if name == "retrieval" else
                    [text(1) for _ in range(rng.randint(1, 3))])
            want = 0.0
            for ref in refs:  # eval.py's scorer
                want = max(want, fn(pred, ref, all_classes=classes))
            got = score(name, pred, refs, **({"all_classes": classes} if name == "classification" else {}))
            if abs(want - got) > 1e-12:
                bad, example = bad + 1, example or (pred, refs, want, got)
        report(f"LongBench {name} vs metrics.py", bad, pairs, example)

    def helmet_reference(mode: str, output: str, answers: list[str]) -> dict:
        if mode == "icl":  # load_icl's post_process
            return hu.calculate_metrics(hu.parse_output("label:" + output, "label:"), answers)
        if mode == "prepend":  # eval.py without the chat template
            output = "Answer:" + output
        mets = hu.calculate_metrics(output, answers)
        if mode != "raw":  # default_post_process
            parsed = hu.parse_output(output)
            if parsed is not None:
                mets = {k: max(v, hu.calculate_metrics(parsed, answers)[k]) for k, v in mets.items()}
        return mets

    modes = {"raw": None, "chat": {"system_template": "Answer:"},
             "prepend": {"system_template": "Answer:", "prepend": True},
             "icl": {"system_template": "label:", "prepend": True, "parsed_only": True}}
    n = max(1, pairs // 5)
    for mode, helmet_args in modes.items():
        for metric in ("exact_match", "f1", "substring_exact_match", "rougeL_f1"):
            bad, example = 0, None
            rng.seed(1)
            for _ in range(n):
                output, answers = text(), [text(1, 4) for _ in range(rng.randint(1, 3))]
                want = float(helmet_reference(mode, output, answers)[metric])
                got = score(metric, output, answers, helmet=helmet_args)
                if abs(want - got) > 1e-12:
                    bad, example = bad + 1, example or (output, answers, want, got)
            report(f"HELMET {metric} ({mode}) vs calculate_metrics", bad, n, example)
    bad = sum(hu.parse_output(o, p) != helmet_parse_output(o, p)
              for o, p in ((text(), rng.choice(["Answer:", "label:"])) for _ in range(pairs)))
    report("HELMET parse_output", bad, pairs)


def check_prompts(longbench: Path, helmet: Path) -> None:
    import datasets
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    sys.path.insert(0, str(ROOT / "tests"))
    import dapq.bench.tasks.helmet as dh
    from dapq.bench.tasks import TaskArgs, build_samples

    from conftest import TOKENIZER as tok

    # LongBench: the official config files, pred.py's formatting (no truncation at this length).
    config = json.loads((longbench / "LongBench/config/dataset2prompt.json").read_text())
    maxlen = json.loads((longbench / "LongBench/config/dataset2maxlen.json").read_text())
    samples = build_samples("longbench", tok, TaskArgs(data=str(FIX / "longbench"), lengths=(100000,), samples=9))
    bad = 0
    for s in samples:
        rows = [json.loads(line) for line in (FIX / f"longbench/data/{s.task}.jsonl").read_text().splitlines()]
        row = next(r for r in rows if s.sample_id.endswith(r["_id"]))
        bad += s.prompt != config[s.task].format(**row) or s.max_new_tokens != maxlen[s.task]
    report("LongBench prompts vs config/dataset2prompt.json", bad, len(samples))
    template = (longbench / "prompts/0shot.txt").read_text()
    items = json.loads((FIX / "longbench-v2/data.json").read_text())
    samples = build_samples("longbench-v2", tok, TaskArgs(data=str(FIX / "longbench-v2"), lengths=(100000,), samples=9))
    bad = 0
    for s, item in zip(samples, items, strict=True):
        prompt = template
        for mark, key in (("$DOC$", "context"), ("$Q$", "question"), ("$C_A$", "choice_A"), ("$C_B$", "choice_B"),
                          ("$C_C$", "choice_C"), ("$C_D$", "choice_D")):
            prompt = prompt.replace(mark, item[key].strip())
        bad += s.prompt != prompt
    report("LongBench v2 prompts vs prompts/0shot.txt", bad, len(samples))

    # HELMET: data.py's loaders; hub loads come from the fixtures' hf/ exports.
    sys.modules.setdefault("pytrec_eval", types.ModuleType("pytrec_eval"))
    sys.path.insert(0, str(helmet))
    hd = __import__("data")
    data_dir = FIX / "helmet/data"
    hd.filter_length = lambda data, min_length, key: data  # the Llama-2 length filters (dapq skips them)
    hd.truncate_llama2 = lambda dataset, data, postfix_text=None: data

    def split(rel, labels):
        rows = [json.loads(line) for line in (data_dir / rel).read_text().splitlines()]
        features = Features({"text": Value("string"), **{k: ClassLabel(num_classes=n) for k, n in labels.items()}})
        return Dataset.from_list(rows, features=features)

    real_load = datasets.load_dataset

    def load_dataset(name, *args, **kwargs):
        if name == "CogComp/trec":
            labels = {"coarse_label": 6, "fine_label": 50}
            return DatasetDict(train=split("hf/CogComp/trec/train.jsonl", labels),
                               test=split("hf/CogComp/trec/test.jsonl", labels))
        if name == "PolyAI/banking77":
            return DatasetDict(train=split("hf/PolyAI/banking77/train.jsonl", {"label": 77}),
                               test=split("hf/PolyAI/banking77/test.jsonl", {"label": 77}))
        if name == "clinc_oos":
            return DatasetDict(train=split("hf/clinc_oos/plus/train.jsonl", {"intent": 151}),
                               validation=split("hf/clinc_oos/plus/validation.jsonl", {"intent": 151}))
        if name == "xingkunliuxtracta/nlu_evaluation_data":
            return DatasetDict(train=split("hf/xingkunliuxtracta/nlu_evaluation_data/train.jsonl", {"label": 68}))
        if name == "xinrongzhang2022/infinitebench":
            rows = [json.loads(line) for line in
                    (data_dir / "hf/xinrongzhang2022/infinitebench/longbook_qa_eng.jsonl").read_text().splitlines()]
            return DatasetDict(longbook_qa_eng=Dataset.from_list(rows, features=kwargs["features"]))
        return real_load(name, *args, **kwargs)

    hd.load_dataset = datasets.load_dataset = load_dataset
    dh._fit = lambda tokenizer, name, user, fields, task, limit: dh._render(user, fields, task)  # untruncated

    def compare(name, loaded, chat):
        args = TaskArgs(data=str(data_dir), lengths=(8192,), samples=500)
        mine = dh.BUILDERS[name](tok, name, dh.data_root(args), args)
        template = loaded["user_template"] if chat else loaded["prompt_template"]
        theirs = [(template.format(**x), x["answer"]) for x in loaded["data"]][: len(mine)]
        bad = len(mine) != len(theirs) or sum(
            s.prompt != p or list(s.references) != ([a] if isinstance(a, str) else list(a))
            for s, (p, a) in zip(mine, theirs, strict=False))
        report(f"HELMET {name} prompts vs data.py", int(bad), len(mine))

    for name, shots in (("icl_trec_coarse", 400), ("icl_trec_fine", 400), ("icl_banking77", 360),
                        ("icl_clinic150", 440), ("icl_nlu", 510)):
        random.seed(42)
        compare(name, hd.load_icl(f"{name}_{shots}shot_balance", max_test_sample=500, seed=42), chat=False)
    for name, stem, depth in (("kilt_nq", "nq", 6), ("kilt_triviaqa", "triviaqa", 6), ("kilt_hotpotqa", "hotpotqa", 3)):
        random.seed(42)
        compare(name, hd.load_qa(name, str(data_dir / f"kilt/{stem}-dev-multikilt_1000_k50_dep{depth}.jsonl"),
                                 str(data_dir / f"kilt/{stem}-train-multikilt_1000_k3_dep{depth}.jsonl"),
                                 max_test_samples=100, shots=2), chat=False)
    random.seed(42)
    compare("kilt_popqa_3", hd.load_qa("kilt_popqa_3", str(data_dir / "kilt/popqa_test_1000_k50_dep6.jsonl"),
                                       str(data_dir / "kilt/popqa_test_1000_k3_dep6.jsonl"), max_test_samples=100,
                                       popularity_threshold=3.0, shots=2), chat=False)
    compare("infbench_qa_eng", hd.load_infbench("infbench_qa_eng_130862", shots=2, max_test_samples=100, seed=42),
            chat=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--longbench", type=Path, required=True, help="a THUDM/LongBench checkout")
    parser.add_argument("--helmet", type=Path, required=True, help="a princeton-nlp/HELMET checkout")
    parser.add_argument("--pairs", type=int, default=20000)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    sys.modules["Levenshtein"] = None  # fuzzywuzzy as LongBench's requirements.txt installs it: difflib
    sys.modules.setdefault("jieba", types.ModuleType("jieba"))  # LongBench's Chinese metrics only
    sys.modules.setdefault("pytrec_eval", types.ModuleType("pytrec_eval"))  # HELMET's re-ranking only
    check_metrics(args.longbench, args.helmet, args.pairs)
    check_prompts(args.longbench, args.helmet)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

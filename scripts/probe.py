"""A careless user and a hostile input against every dapq command (issue 21's probe, rerunnable).

Each case runs ``python -m dapq.cli ...`` in a child process on a tiny random Llama (built from
the tests' config, saved to a temporary directory) and is judged by how it ended:

- ``one line``: exit 2 with exactly one line on stderr and no traceback (bad input, as required);
- ``ran``: exit 0 (a valid input, or a fault the run survives);
- ``interrupted``: exit 130 with one line (Ctrl-C);
- anything else is a ``FAIL``, printed with its stderr's last line.

The fault cases (a kill, a deleted output, a torn or unterminated last line, duplicate records)
also print the record counts before and after.

    .venv/bin/python scripts/probe.py > docs/results/probe/probe.md
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conftest import TOKENIZER, tiny_model  # noqa: E402

ROOT = Path(tempfile.mkdtemp(prefix="dapq-probe-"))
ROWS: list[tuple[str, str, str]] = []


def cli(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dapq.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def verdict(done: subprocess.CompletedProcess, want: str) -> tuple[str, str]:
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("dapq: warning")]
    last = lines[-1] if lines else ""
    if "Traceback" in done.stderr:
        got = "traceback"
    elif done.returncode == 2 and len(lines) == 1:
        got = "one line"
    elif done.returncode == 0:
        got = "ran"
    elif done.returncode == 130 and len(lines) == 1:
        got = "interrupted"
    else:
        got = f"exit {done.returncode}, {len(lines)} lines"
    return ("ok" if got == want else "FAIL") + f": {got}", last[:150]


def case(name: str, *args: str, want: str = "one line", **kw) -> subprocess.CompletedProcess:
    done = cli(*args, **kw)
    status, last = verdict(done, want)
    ROWS.append((name, status, last))
    return done


def records(path: Path) -> tuple[int, int]:
    """(lines holding a record, distinct keys) of a results or generation file."""
    if not path.exists():
        return 0, 0
    keys = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and ("key" in row or "id" in row):
            keys.append(row.get("key", row.get("id")))
    return len(keys), len(set(keys))


def setup() -> dict[str, str]:
    model = ROOT / "model"
    tiny_model("llama", max_position_embeddings=1024).save_pretrained(model)
    TOKENIZER.save_pretrained(model)
    truncated = ROOT / "truncated"
    shutil.copytree(model, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    files = {"model": str(model), "truncated": str(truncated)}
    for name, text in {"requests.jsonl": '{"id": "a", "prompt": "The sky is blue."}\n{"id": "b", "prompt": "Hi."}\n',
                       "badjson.jsonl": '{"id": "a", "prompt": "x"\n', "empty.jsonl": "",
                       "binary.jsonl": "\udcff", "noid.jsonl": '{"prompt": "x"}\n',
                       "prompt.txt": "The grass is green. " * 20}.items():
        (ROOT / name).write_text(text, errors="surrogateescape")
        files[name] = str(ROOT / name)
    (ROOT / "adir").mkdir()
    files["dir"] = str(ROOT / "adir")
    return files


def bad_inputs(f: dict[str, str]) -> None:
    m = ["--model", f["model"]]
    gen = ["generate", *m, "--prompt", "The sky is blue.", "--max-new-tokens", "4"]
    case("generate: valid", *gen, "--budget", "8", want="ran")
    for name, extra in [
        ("no prompt", ["--budget", "8", "--prompt", ""]), ("budget 0", ["--budget", "0"]),
        ("budget -1", ["--budget", "-1"]), ("keep-fraction 0", ["--keep-fraction", "0"]),
        ("keep-fraction 1.5", ["--keep-fraction", "1.5"]), ("budget and fraction", ["--budget", "8", "--keep-fraction", "0.5"]),
        ("no budget", []), ("unknown method", ["--method", "nosuch", "--budget", "8"]),
        ("window=2.5", ["--method", "snapkv(window=2.5)", "--budget", "8"]),
        ("window=1e400", ["--method", "snapkv(window=1e400)", "--budget", "8"]),
        ("window='x'", ["--method", "snapkv(window='x')", "--budget", "8"]),
        ("dapq window=1.5", ["--method", "dapq(window=1.5)", "--budget", "8"]),
        ("seed='x'", ["--method", "dapq(seed='x')", "--budget", "8"]),
        ("keep_recent=100000", ["--method", "h2o(keep_recent=100000)", "--budget", "8"]),
        ("deferkv steps=20000", ["--method", "deferkv(steps=20000)", "--budget", "8"]),
        ("budget inside the spec", ["--method", "dapq(budget=8)"]),
        ("token_ids out of vocab", ["--method", "dapq(content='tokens',token_ids=(1,99999))", "--budget", "8"]),
        ("negative token id", ["--method", "dapq(content='tokens',token_ids=(1,-2))", "--budget", "8"]),
        ("max-new-tokens 0", ["--budget", "8", "--max-new-tokens", "0"]),
        ("temperature -1", ["--budget", "8", "--temperature", "-1", "--sample"]),
        ("top-p 2", ["--budget", "8", "--top-p", "2", "--sample"]),
        ("dtype float8", ["--budget", "8", "--dtype", "float8"]),
        ("device cuda without one", ["--budget", "8", "--device", "cuda"]),
        ("device nosuch", ["--budget", "8", "--device", "nosuch"]),
        ("flash attention on cpu", ["--budget", "8", "--attn", "flash_attention_2"]),
        ("decode bogus", ["--budget", "8", "--decode", "bogus"]),
        ("window without dapq family", ["--method", "streamingllm", "--window", "4", "--budget", "8"]),
    ]:
        case(f"generate: {name}", *gen, *extra)
    case("generate: token_ids tuple", *gen, "--method", "dapq(content='tokens',token_ids=(1,2,3))", "--budget", "8",
         want="ran")
    base = ["generate", *m, "--budget", "8", "--max-new-tokens", "4"]
    for name, extra in [
        ("prompt-file missing", ["--prompt-file", "/no/such"]), ("prompt-file a dir", ["--prompt-file", f["dir"]]),
        ("context-file a dir", ["--context-file", f["dir"], "--question", "q"]),
        ("input missing", ["--input", "/no/such", "--output", str(ROOT / "o1.jsonl")]),
        ("input a dir", ["--input", f["dir"], "--output", str(ROOT / "o1.jsonl")]),
        ("input bad JSON", ["--input", f["badjson.jsonl"], "--output", str(ROOT / "o1.jsonl")]),
        ("input empty", ["--input", f["empty.jsonl"], "--output", str(ROOT / "o1.jsonl")]),
        ("input not UTF-8", ["--input", f["binary.jsonl"], "--output", str(ROOT / "o1.jsonl")]),
        ("input without ids", ["--input", f["noid.jsonl"], "--output", str(ROOT / "o1.jsonl")]),
        ("output a dir", ["--input", f["requests.jsonl"], "--output", f["dir"]]),
        ("output under a file", ["--input", f["requests.jsonl"], "--output", f["prompt.txt"] + "/o.jsonl"]),
        ("input without output", ["--input", f["requests.jsonl"]]),
    ]:
        case(f"generate: {name}", *base, *extra)
    for name, model in [("model missing dir", "/no/such/model"), ("model truncated weights", f["truncated"]),
                        ("model a file", f["prompt.txt"])]:
        case(f"generate: {name}", "generate", "--model", model, "--prompt", "x", "--budget", "8")
    bench = ["bench", "niah", *m, "--lengths", "200", "--depths", "0.5", "--samples", "1"]
    for name, extra in [
        ("unknown task set", ["--out", str(ROOT / "b0")]), ("lengths too long", ["--lengths", "100000"]),
        ("budgets x", ["--budgets", "x"]), ("keep-fractions 1.5", ["--keep-fractions", "1.5"]),
        ("depths 2", ["--depths", "2"]), ("samples 0", ["--samples", "0"]), ("out a file", ["--out", f["prompt.txt"]]),
        ("decode-batch 0", ["--decode-batch", "0"]), ("compress bogus", ["--compress", "bogus"]),
        ("unknown kvpress press", ["--methods", "kvpress:NoSuchPress"]),
        ("kvpress bad argument", ["--methods", "kvpress:SnapKVPress(window_size=-1)"]),
        ("ray unreachable", ["--ray=nosuchhost.invalid:1"]), ("workers without ray", ["--workers", "2"]),
    ]:
        args = (["bench", "nosuch", *m] if name == "unknown task set" else bench) + extra
        case(f"bench: {name}", *args, *(["--out", str(ROOT / "b1")] if "--out" not in extra else []),
             env={"DAPQ_RAY_CONNECT_TIMEOUT": "3"})
    case("bench: longbench data missing", "bench", "longbench", *m, "--data", "/no/such", "--out", str(ROOT / "b2"))
    speed = ["bench", "speed", *m, "--out", str(ROOT / "s0"), "--decode-tokens", "2", "--repeats", "1", "--warmup", "0",
             "--lengths", "200", "--context", "300"]
    for name, extra in [
        ("parts bogus", ["--parts", "bogus"]), ("budget 0", ["--budget", "0"]), ("batches 0", ["--batches", "0"]),
        ("lengths x", ["--lengths", "x"]), ("memory-limit -1", ["--memory-limit", "-1"]),
        ("unknown method", ["--methods", "nosuch"]), ("unknown peer", ["--parts", "peer", "--peers", "kvpress:Nope"]),
        ("context beyond the model", ["--parts", "decode", "--context", "5000"]),
    ]:
        case(f"bench speed: {name}", *speed, *extra)
    case("bench speed: decode at 300 (TTFT lengths not checked)", *speed, "--parts", "decode", "--context", "300",
         "--batches", "1", "--methods", "full,dapq", "--budget", "16", want="ran")
    (ROOT / "foreign").mkdir()
    (ROOT / "foreign" / "results.jsonl").write_text('{"something": "else"}\n')
    for name, target in [("missing dir", "/no/such"), ("dir without results", f["dir"]),
                         ("foreign results file", str(ROOT / "foreign"))]:
        case(f"report: {name}", "report", target)
    for name, args in [
        ("analyze recall: budget 0", ["analyze", "recall", *m, "--budget", "0", "--out", str(ROOT / "a0")]),
        ("analyze recall: windows x", ["analyze", "recall", *m, "--windows", "x", "--out", str(ROOT / "a0")]),
        ("analyze similarity: unknown taskset", ["analyze", "similarity", *m, "--taskset", "nosuch", "--out",
                                                 str(ROOT / "a1")]),
        ("analyze ablation: budget 0", ["analyze", "ablation", *m, "--budget", "0", "--out", str(ROOT / "a2")]),
        ("demo: length 0", ["demo", "--length", "0"]),
        ("unknown command", ["nosuch"]), ("unknown option", ["generate", "--nosuch"]),
    ]:
        case(name, *args)


def faults(f: dict[str, str]) -> list[str]:
    """Kills, deletions and hand edits of a running or finished sweep; the record counts before and after."""
    notes = []
    out = ROOT / "sweep"
    args = [sys.executable, "-m", "dapq.cli", "bench", "niah", "--model", f["model"], "--lengths", "200", "--depths",
            ",".join(str(d / 10) for d in range(11)), "--samples", "2", "--methods", "full,dapq,snapkv",
            "--budgets", "16,32", "--out", str(out)]
    total = 11 * 2 * 5
    results = out / "results.jsonl"

    def run_until(n: int, sig: int) -> subprocess.CompletedProcess | None:
        # SIGINT's default disposition in the child, even when this probe runs as a background job.
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        while proc.poll() is None and records(results)[0] < n:
            time.sleep(0.05)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
        return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)

    done = run_until(10, signal.SIGINT)
    kept = records(results)
    ROWS.append(("bench: Ctrl-C mid-sweep", *verdict(done, "interrupted")))
    run_until(kept[0] + 10, signal.SIGKILL)
    killed = records(results)
    with open(results, "a") as fh:
        fh.write('{"key": "torn", "sco')
    resumed = subprocess.run(args, capture_output=True, text=True)
    after = records(results)
    ROWS.append(("bench: SIGKILL, torn last line, resume", *verdict(resumed, "ran")))
    notes.append(f"- Ctrl-C then SIGKILL then a torn line, then a resume: {kept[0]} records kept at the interrupt, "
                 f"{killed[0]} after the kill; the resume ended with {after[0]} records, {after[1]} distinct keys "
                 f"(the sweep has {total} cells).")
    text = results.read_text().rstrip("\n")
    results.write_text(text)  # the last record loses its newline
    resumed = subprocess.run(args, capture_output=True, text=True)
    again = records(results)
    ROWS.append(("bench: last record without its newline, resume", *verdict(resumed, "ran")))
    notes.append(f"- A last record without its newline: {after[0]} records before, {again[0]} after a resume "
                 f"({again[1]} distinct; nothing dropped or rerun).")
    lines = results.read_text().splitlines()
    results.write_text("\n".join(lines + lines[1:6]) + "\n")  # five records written twice
    done = cli("report", str(out), "--no-plots")
    dup = records(results)
    counted = next((line for line in done.stdout.splitlines() if "finished cells" in line), "")
    ROWS.append(("report: five duplicated records", *verdict(done, "ran")))
    notes.append(f"- Five duplicated lines: {dup[0]} record lines, {dup[1]} keys; the report says \"{counted}\".")
    case("report: --against an unknown label", "report", str(out), "--against", "nosuch", "--no-plots")
    case("bench: the same directory in bfloat16", *args[3:], "--dtype", "bfloat16")
    # Deleted while running: the first run stops at its next record, the second one owns the new file.
    out2 = ROOT / "sweep2"
    args2 = [a if a != str(out) else str(out2) for a in args]
    first = subprocess.Popen(args2, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while first.poll() is None and records(out2 / "results.jsonl")[0] < 5:
        time.sleep(0.05)
    shutil.rmtree(out2)
    second = subprocess.run(args2, capture_output=True, text=True)
    first_out = first.communicate(timeout=300)
    final = records(out2 / "results.jsonl")
    ROWS.append(("bench: output deleted mid-run (first writer)",
                 *verdict(subprocess.CompletedProcess(args2, first.returncode, *first_out), "one line")))
    ROWS.append(("bench: output deleted mid-run (second writer)", *verdict(second, "ran")))
    notes.append(f"- Output deleted mid-run, a second run started: {final[0]} records, {final[1]} distinct keys "
                 f"(the sweep has {total} cells; before the lock checked its path, both runs appended).")
    return notes


def main() -> None:
    f = setup()
    bad_inputs(f)
    notes = faults(f)
    failed = [r for r in ROWS if r[1].startswith("FAIL")]
    print(f"# dapq probe: {len(ROWS)} cases, {len(ROWS) - len(failed)} as required, {len(failed)} not\n")
    print("| case | ended | last stderr line |\n|---|---|---|")
    for name, status, last in ROWS:
        print(f"| {name} | {status} | {last.replace('|', '/')} |")
    print("\n## Record counts in the fault cases\n")
    print("\n".join(notes))
    shutil.rmtree(ROOT, ignore_errors=True)


if __name__ == "__main__":
    main()

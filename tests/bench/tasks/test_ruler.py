"""RULER generators: deterministic per seed, on length, answers present in the prompt."""

from __future__ import annotations

import pytest

from dapq.bench.tasks import TaskArgs, build_samples
from dapq.bench.tasks.ruler import TASKS
from dapq.prompts import encode_prompts


@pytest.fixture(scope="module")
def ruler(tokenizer):
    return build_samples("ruler", tokenizer, TaskArgs(lengths=(2500,), samples=2, seed=1))


def test_all_eleven_tasks(ruler):
    assert len(TASKS) == 11
    assert {s.task for s in ruler} == set(TASKS)
    assert all(s.metric == "string_match_all" for s in ruler)


def test_lengths_and_determinism(tokenizer, ruler):
    again = build_samples("ruler", tokenizer, TaskArgs(lengths=(2500,), samples=2, seed=1))
    other = build_samples("ruler", tokenizer, TaskArgs(lengths=(2500,), samples=2, seed=2))
    assert [s.prompt for s in ruler] == [s.prompt for s in again]
    assert all(a.prompt != b.prompt for a, b in zip(ruler, other, strict=True))
    for s in ruler:
        n = len(encode_prompts(tokenizer, [s.prompt], chat=True, answer_prefix=s.answer_prefix)[0])
        # Within one filler unit: an essay sentence is up to ~150 tokens with this tiny tokenizer.
        assert 2350 <= n <= 2500, (s.task, n)


def test_references_are_findable(ruler):
    for s in ruler:
        if s.task in ("cwe", "fwe"):
            for word in s.references:
                assert s.prompt.count(word) >= 2
        else:
            assert all(ref in s.prompt for ref in s.references), s.task
    mq = next(s for s in ruler if s.task == "niah_multiquery")
    mv = next(s for s in ruler if s.task == "niah_multivalue")
    vt = next(s for s in ruler if s.task == "vt")
    assert len(mq.references) == 4 and len(mv.references) == 4 and len(vt.references) == 5


def test_context_ends_before_the_question(ruler):
    """--compress context compresses prompt[:context_end]; the question follows it, never inside it."""
    for s in ruler:
        context, question = s.prompt[: s.context_end], s.prompt[s.context_end :]
        assert question.startswith("\n") and question.rstrip()[-1] in "?.", s.task
        assert "Question:" not in context and "What are all" not in context, s.task

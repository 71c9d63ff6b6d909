"""Request traces: strict JSONL and CSV loading, one-line errors naming the line, a seeded generator."""

from __future__ import annotations

import os

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.serve.trace import load_trace, poisson_trace, trace_jsonl

ADAPTERS = ("A", "B")


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_and_csv_load_the_same_requests(tmp_path):
    j = write(tmp_path, "t.jsonl", '{"arrival_s": 0, "adapter": "A", "prompt_tokens": 5, "generate_tokens": 2}\n\n'
                                   '{"arrival_s": 0.5, "adapter": "B", "prompt_tokens": 7, "generate_tokens": 1}\n')
    c = write(tmp_path, "t.csv", "arrival_s,adapter,prompt_tokens,generate_tokens\n0,A,5,2\n0.5,B,7,1\n")
    for path in (j, c):
        t = load_trace(path, ADAPTERS, 64)
        np.testing.assert_array_equal(t.arrival_s, [0.0, 0.5])
        np.testing.assert_array_equal(t.adapter, [0, 1])
        np.testing.assert_array_equal(t.prompt, [5, 7])
        np.testing.assert_array_equal(t.generate, [2, 1])


@pytest.mark.parametrize("line, message", [
    ('{"arrival_s": -1, "adapter": "A", "prompt_tokens": 5, "generate_tokens": 2}', "arrival_s must be a finite time"),
    ('{"arrival_s": 0, "adapter": "Z", "prompt_tokens": 5, "generate_tokens": 2}', "unknown adapter 'Z'"),
    ('{"arrival_s": 0, "adapter": "A", "prompt_tokens": 60, "generate_tokens": 5}', "exceeds the context of 64"),
    ('{"arrival_s": 0, "adapter": "A", "prompt_tokens": 0, "generate_tokens": 5}', "prompt_tokens must be a whole"),
    ('{"arrival_s": 0, "adapter": "A", "prompt_tokens": 2.5, "generate_tokens": 5}', "prompt_tokens must be a whole"),
    ('{"arrival_s": 0, "adapter": "A", "prompt_tokens": 5}', "missing generate_tokens"),
    ('{"arrival_s": 0, "adapter": "A", "prompt_tokens": 5, "generate_tokens": 2, "x": 1}', "unknown x"),
    ('{"arrival_s": "soon", "adapter": "A", "prompt_tokens": 5, "generate_tokens": 2}', "must be a number"),
    ("[1, 2]", "not a JSON object"),
    ("{oops", "not a JSON object"),
])
def test_a_bad_request_is_one_line_naming_its_line(tmp_path, line, message):
    ok = '{"arrival_s": 0, "adapter": "A", "prompt_tokens": 5, "generate_tokens": 2}'
    path = write(tmp_path, "t.jsonl", ok + "\n" + line + "\n")
    with pytest.raises(InputError, match=message) as err:
        load_trace(path, ADAPTERS, 64)
    assert str(err.value.where) == f"{path}:2" and "\n" not in str(err.value)


def test_an_unsorted_trace_is_refused(tmp_path):
    path = write(tmp_path, "t.csv", "arrival_s,adapter,prompt_tokens,generate_tokens\n1,A,5,2\n0.5,A,5,2\n")
    with pytest.raises(InputError, match="before the previous request's 1: the trace must be in arrival order"):
        load_trace(path, ADAPTERS, 64)


@pytest.mark.parametrize("name, text, message", [
    ("t.txt", "", "a .jsonl or a .csv file"),
    ("t.jsonl", "\n", "holds no request"),
    ("t.csv", "arrival_s,adapter\n0,A,5\n", "3 values for the header's 2 fields"),
])
def test_a_bad_file_is_refused(tmp_path, name, text, message):
    with pytest.raises(InputError, match=message):
        load_trace(write(tmp_path, name, text), ADAPTERS, 64)
    with pytest.raises(InputError, match="no such trace file"):
        load_trace(tmp_path / "none.jsonl", ADAPTERS, 64)


def test_the_generator_is_seeded_and_round_trips(tmp_path):
    a = poisson_trace(2000, 50.0, ("A", "B", "C"), 1.0, (4, 9), (1, 3), seed=7)
    b = poisson_trace(2000, 50.0, ("A", "B", "C"), 1.0, (4, 9), (1, 3), seed=7)
    assert trace_jsonl(a) == trace_jsonl(b)
    assert (np.diff(a.arrival_s) >= 0).all() and a.prompt.min() >= 4 and a.prompt.max() <= 9
    share = np.bincount(a.adapter, minlength=3) / 2000
    np.testing.assert_allclose(share, np.array([1, 1 / 2, 1 / 3]) / (11 / 6), atol=0.03)  # Zipf, exponent 1
    assert abs(a.arrival_s[-1] / 2000 - 1 / 50.0) < 0.1 / 50  # mean gap 1 / rate
    back = load_trace(write(tmp_path, "g.jsonl", trace_jsonl(a)), ("A", "B", "C"), 64)
    np.testing.assert_allclose(back.arrival_s, a.arrival_s, atol=1e-9)
    np.testing.assert_array_equal(back.adapter, a.adapter)


def test_conversations_carry_their_history_and_keep_their_adapter(tmp_path):
    text = ("arrival_s,adapter,prompt_tokens,generate_tokens,conversation\n"
            "0,A,5,2,x\n0.1,B,3,1,\n0.2,A,4,2,x\n0.3,A,6,1,y\n0.4,A,1,1,x\n")
    t = load_trace(write(tmp_path, "t.csv", text), ADAPTERS, 64)
    np.testing.assert_array_equal(t.conversation, [0, -1, 0, 1, 0])
    np.testing.assert_array_equal(t.history, [0, 0, 7, 0, 13])  # x: 5 + 2, then + 4 + 2
    back = load_trace(write(tmp_path, "t.jsonl", trace_jsonl(t)), ADAPTERS, 64)
    np.testing.assert_array_equal(back.history, t.history)
    np.testing.assert_array_equal(back.conversation, t.conversation)


@pytest.mark.parametrize("line, message", [
    ('{"arrival_s": 1, "adapter": "B", "prompt_tokens": 5, "generate_tokens": 2, "conversation": "x"}',
     "conversation x runs on adapter 'A', not 'B': its KV cache is bound to its adapter"),
    ('{"arrival_s": 1, "adapter": "A", "prompt_tokens": 50, "generate_tokens": 8, "conversation": "x"}',
     "7 tokens of earlier turns \\+ prompt_tokens 50 \\+ generate_tokens 8 exceeds the context of 64"),
    ('{"arrival_s": 1, "adapter": "A", "prompt_tokens": 5, "generate_tokens": 2, "conversation": 1.5}',
     "conversation must be a name \\(a string or an integer\\), got 1.5"),
    ('{"arrival_s": 1, "adapter": "A", "prompt_tokens": 5, "generate_tokens": 2, "conversation": true}',
     "conversation must be a name .*got True"),
])
def test_a_broken_conversation_is_one_line_naming_its_line(tmp_path, line, message):
    first = '{"arrival_s": 0, "adapter": "A", "prompt_tokens": 5, "generate_tokens": 2, "conversation": "x"}'
    path = write(tmp_path, "t.jsonl", first + "\n" + line + "\n")
    with pytest.raises(InputError, match=message) as err:
        load_trace(path, ADAPTERS, 64)
    assert str(err.value.where) == f"{path}:2"


def test_the_generator_makes_conversations_that_fit(tmp_path):
    a = poisson_trace(3000, 20.0, ("A", "B", "C"), 1.0, (4, 30), (1, 20), seed=5, turns=(1, 6), think_s=2.0,
                      context=128)
    assert trace_jsonl(a) == trace_jsonl(poisson_trace(3000, 20.0, ("A", "B", "C"), 1.0, (4, 30), (1, 20), seed=5,
                                                       turns=(1, 6), think_s=2.0, context=128))
    assert len(a) == 3000 and (np.diff(a.arrival_s) >= 0).all()
    assert (a.history + a.prompt + a.generate <= 128).all() and (a.history > 0).sum() > 1000
    back = load_trace(write(tmp_path, "g.jsonl", trace_jsonl(a)), ("A", "B", "C"), 128)  # history re-derived
    np.testing.assert_array_equal(back.history, a.history)
    np.testing.assert_array_equal(back.conversation, a.conversation)
    assert 14.0 < len(a) / a.arrival_s[-1] < 20.5  # at most the rate: conversations cut short have fewer turns


@pytest.mark.parametrize("turns", [(1, 1), (2, 4)])
def test_the_generator_refuses_requests_that_cannot_fit(turns):
    with pytest.raises(InputError, match=r"longest prompt \(60\) and generation \(10\) would not fit the context of 64"):
        poisson_trace(10, 1.0, ("A",), 1.0, (4, 60), (1, 10), seed=0, turns=turns, context=64)


def test_the_generator_clips_turns_to_what_can_fit():
    """At most 64 // (1 + 1) = 32 turns fit: asking for up to 10^5 draws 2 to 32, and conversations start at
    the rate over that range's mean."""
    t = poisson_trace(2000, 10.0, ("A",), 1.0, (1, 1), (1, 1), seed=1, turns=(2, 100_000), context=64)
    per = np.bincount(t.conversation)
    assert per.max() <= 32 and len(t) == 2000 and (t.history + t.prompt + t.generate <= 64).all()
    with pytest.raises(InputError, match=r"draw [\d,]+ turns, more than 50,000,000"):
        poisson_trace(10_000_000, 1.0, ("A",), 1.0, (1, 1), (1, 1), seed=0, turns=(20, 32), context=64)


@pytest.mark.parametrize("line, problem", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("[" * 100_000, "nested too deeply"),
    ('{"arrival_s": 0, "adapter": "a", "prompt_tokens": ' + "9" * 5000 + ', "generate_tokens": 2}', "digits"),
    ('{"arrival_s": 1' + "0" * 400 + ', "adapter": "a", "prompt_tokens": 2, "generate_tokens": 2}',
     "arrival_s must be a number"),
])
def test_an_absurd_json_line_is_one_input_error(tmp_path, line, problem):
    """Issue 47: deep nesting was a RecursionError, a 5000-digit integer a ValueError, a 400-digit one an
    OverflowError; each is bad input naming the file and line."""
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(InputError, match=problem) as err:
        load_trace(path, ("a",), 2048)
    assert str(err.value).startswith(f"{path}:1: ")


def test_a_fifo_trace_is_refused_without_opening_it(tmp_path):
    path = tmp_path / "t.jsonl"
    os.mkfifo(path)
    with pytest.raises(InputError, match="is a FIFO, not a regular trace file"):
        load_trace(path, ("a",), 2048)

"""The command line: ``python -m minengine run`` and ``generate``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine.__main__ import prompt_tail


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minengine", *args], capture_output=True, text=True, timeout=600)


def test_run_serves_a_batch_and_prints_a_summary(bundled_model):
    p = run("run", "--num-prompts", "6", "--num-real-prompts", "2", "--min-tokens", "4", "--max-tokens", "12",
            "--max-num-batched-tokens", "64", "--num-kv-blocks", "64")
    assert p.returncode == 0, p.stderr
    for key in ("TTFT P50/P95/P99", "TPOT P50/P95/P99", "output tok/s", "preemptions", "prefix hit tokens",
                "peak KV blocks used", "--- request"):
        assert key in p.stdout


def test_generate_prints_a_completion(bundled_model):
    p = run("generate", "ROMEO:", "--max-tokens", "16")
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.strip()) > 10


def test_bad_option_is_a_clear_error():
    p = run("generate", "ROMEO:", "--block-size", "0")
    assert p.returncode == 2 and "block_size" in p.stderr and "Traceback" not in p.stderr


def test_file_errors_are_messages_not_tracebacks(tmp_path):
    for args, text in [(("bench-serve", "--trace", "azure", "--trace-path", "/nonexistent.csv"), "error"),
                       (("bench-serve", "--result-json", "/nonexistent/dir/x.json"), "result-json"),
                       (("run", "--min-tokens", "10", "--max-tokens", "5"), "min-tokens"),
                       (("run", "--num-real-prompts", "-1"), "num-real-prompts")]:
        p = run(*args)
        assert p.returncode == 2 and text in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


def test_speculative_config_flag(bundled_model):
    """vLLM's ``--speculative-config`` JSON; a bad value is a usage error naming the field."""
    p = run("run", "--num-prompts", "3", "--num-real-prompts", "0", "--min-tokens", "8", "--max-tokens", "16",
            "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}')
    assert p.returncode == 0, p.stderr
    assert "speculative" in p.stdout
    for bad, text in (('{"num_speculative_tokens": 0}', "num_speculative_tokens"), ("[1]", "speculative-config"),
                      ("{nope", "speculative-config")):
        p = run("generate", "ROMEO:", "--speculative-config", bad)
        assert p.returncode == 2 and text in p.stderr and "Traceback" not in p.stderr, (bad, p.stderr)


@settings(max_examples=300, deadline=None)
@given(words=st.lists(st.text(alphabet="abcdeé漢", min_size=1, max_size=30), max_size=60),
       seps=st.lists(st.sampled_from([" ", "\n", "  ", "\t"]), min_size=60, max_size=60),
       max_chars=st.integers(1, 250))
def test_a_prompt_tail_is_cut_at_a_word_boundary(words, seps, max_chars):
    """``run`` prints a long prompt's end from a word's start, after an ellipsis, never longer than asked."""
    prompt = "".join(w + s for w, s in zip(words, seps)).rstrip()
    tail = prompt_tail(prompt, max_chars)
    if len(prompt) <= max_chars:
        assert tail == prompt
        return
    assert tail.startswith("…") and len(tail) <= max_chars + 1
    body = tail[1:]
    assert prompt.endswith(body) and body == body.lstrip()
    start = len(prompt) - len(body)
    fits_a_word = any(c.isspace() for c in prompt[-max_chars:].strip())
    if fits_a_word and body:  # the kept text starts a word: the character before it is whitespace
        assert prompt[start - 1].isspace()


def test_a_prompt_tail_examples():
    assert prompt_tail("to be or not to be", 9) == "…not to be"
    assert prompt_tail("to be or not to be", 10) == "…not to be"
    assert prompt_tail("to be or not to be", 11) == "…not to be"
    assert prompt_tail("to be or not to be", 12) == "…or not to be"
    assert prompt_tail("x" * 300, 200) == "…" + "x" * 200
    assert prompt_tail("short", 200) == "short"
    with pytest.raises(ValueError, match="max_chars"):
        prompt_tail("abc", 0)

"""The command line: ``python -m minengine run`` and ``generate``."""

from __future__ import annotations

import subprocess
import sys


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

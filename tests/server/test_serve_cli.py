"""``python -m minengine serve`` as a user starts it, and ``bench-serve --base-url`` against a live server."""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai

from minengine.__main__ import main
from minengine.entrypoints.server_process import ServerProcess
from tests.server_helpers import free_socket, running_server


def test_serve_command_answers_the_openai_client(bundled_model):
    # with the flags a vLLM user passes (vllm serve MODEL --dtype auto ...), which EngineArgs.add_cli_args defines
    server = ServerProcess([bundled_model, "--max-model-len", "256", "--served-model-name", "bard", "--dtype", "auto",
                            "--tensor-parallel-size", "1", "--enforce-eager", "--num-gpu-blocks-override", "64",
                            "--generation-config", "vllm", "--api-key", "k3y"], timeout_s=180)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k3y", timeout=60, max_retries=0)
        r = client.completions.create(model="bard", prompt="ROMEO:", max_tokens=8, temperature=0)
        assert r.model == "bard" and r.usage.completion_tokens == 8
        assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 401  # no key
        assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401  # every route but the probes
        metrics = httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer k3y"}, timeout=10).text
        assert 'model_name="bard"' in metrics and 'num_gpu_blocks="64"' in metrics
    finally:
        server.stop(timeout_s=60)
    out = server.output_text()
    assert "minengine serving 'bard'" in out and "API key required" in out


def test_serve_help_shows_every_default_once():
    import re

    text = subprocess.run([sys.executable, "-m", "minengine", "serve", "--help"], capture_output=True, text=True,
                          timeout=120).stdout
    entries = re.split(r"\n  (?=-)", text.split("options:", 1)[1])
    for entry in entries:
        if entry.strip() and entry.split()[0] not in ("-h,", "model_tag"):
            assert entry.count("(default") == 1, entry
    for flag in ("--host", "--port", "--served-model-name", "--max-history-steps", "--max-num-batched-tokens"):
        assert flag in text


def _table(text: str) -> dict[str, str]:
    rows = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith(("=", "-")):
            key, _, value = line.rpartition(":")
            rows[key.strip()] = value.strip()
    return rows


def test_bench_serve_base_url_prints_the_same_table(bundled_model, capsys):
    workload = ["--trace", "poisson", "--num-requests", "8", "--request-rate", "20", "--input-len", "32",
                "--output-len", "8", "--max-model-len", "512", "--slo-ttft-ms", "2000"]
    with running_server(bundled_model) as server:
        main(["bench-serve", "--base-url", server.url, *workload])
        remote = capsys.readouterr().out
        server.wait_idle()
        served = server.engine.summary()
    main(["bench-serve", *workload])
    local = capsys.readouterr().out
    r, loc = _table(remote), _table(local)
    assert "Serving Benchmark Result" in remote and "Serving Benchmark Result" in local
    for key in ("Successful requests", "Total input tokens", "Total generated tokens"):
        assert r[key] == loc[key], key
    assert r["Successful requests"] == "8" and r["Total generated tokens"] == "64" and "failed requests 0" in remote
    assert served.num_requests == 8 and served.output_tokens == 64 and served.prompt_tokens == 8 * 32
    for key in ("Mean TTFT (ms)", "P99 ITL (ms)", "Request goodput (req/s)"):
        assert float(r[key]) > 0, key


def test_bench_serve_base_url_unreachable_is_a_message(bundled_model):
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    p = subprocess.run([sys.executable, "-m", "minengine", "bench-serve", "--base-url", f"http://127.0.0.1:{port}",
                        "--trace", "poisson", "--num-requests", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "base-url" in p.stderr and "Traceback" not in p.stderr

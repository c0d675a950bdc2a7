"""The vLLM compatibility suite: scripts using minengine as vLLM's offline examples use vLLM (tests/vllm_compat/)
run, and would run on vLLM with only their import lines changed (the map of tests/vllm_compat/README.md)."""

from __future__ import annotations

import ast
import os
import runpy
import sys
from pathlib import Path

import pytest

from minengine.metrics.prometheus import PrometheusStatLogger

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "tests" / "vllm_compat").glob("*.py"))
# the vLLM modules these scripts may import from (minengine has each under the same path, ``vllm`` -> ``minengine``)
VLLM_MODULES = {"vllm", "vllm.sampling_params", "vllm.inputs", "vllm.engine.arg_utils", "vllm.utils",
                "vllm.distributed", "vllm.v1.metrics.reader", "vllm.v1.engine.async_llm", "vllm.config",
                "vllm.v1.sample.logits_processor", "vllm.v1.sample.logits_processor.builtin",
                "vllm.utils.argparse_utils", "vllm.logprobs", "vllm.logger"}


def to_vllm(source: str) -> str:
    """The script with ``minengine`` replaced by ``vllm`` in its import lines; raises if anything else names
    minengine as code (a module attribute, a plain ``import minengine``) or a module vLLM does not have."""
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "minengine" for a in node.names):
            raise AssertionError(f"line {node.lineno}: use `from ... import`, as vLLM's examples do")
        if isinstance(node, ast.Name) and node.id == "minengine":
            raise AssertionError(f"line {node.lineno}: minengine used as a name")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "minengine":
            target = "vllm" + node.module[len("minengine"):]
            if target not in VLLM_MODULES:
                raise AssertionError(f"line {node.lineno}: no vLLM module {target}")
            i = node.lineno - 1
            lines[i] = lines[i].replace(f"from {node.module} import", f"from {target} import", 1)
    return "\n".join(lines) + "\n"


def test_there_are_scripts_for_every_example_kind():
    names = {p.stem for p in SCRIPTS}
    assert {"basic", "chat", "prefix_caching", "reproducibility", "llm_engine_example", "logprobs", "n_sampling",
            "metrics"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_script_runs_and_ports_to_vllm_by_its_imports(script, monkeypatch, capsys):
    source = script.read_text()
    vllm_source = to_vllm(source)
    compile(vllm_source, str(script), "exec")
    changed = [(a, b) for a, b in zip(source.splitlines(), vllm_source.splitlines()) if a != b]
    assert changed and all(a.startswith("from minengine") and b.startswith("from vllm") for a, b in changed)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [str(script)])
    monkeypatch.delenv("MODEL", raising=False)
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert out.strip()


def test_metric_names_are_vllms():
    """The vllm: series minengine exports are the 36 vLLM's PrometheusStatLogger registers whatever the
    configuration (0.33's and prompt_tokens_cached_by_source; spec decoding, LoRA, KV-cache residency and NaN
    counting add more, only when enabled); none of them is minengine's own (prompt_tokens_recomputed is not
    vLLM's: it is minengine:)."""
    vllm_names = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                  "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions", "vllm:prompt_tokens",
                  "vllm:generation_tokens", "vllm:request_success", "vllm:request_prompt_tokens",
                  "vllm:request_generation_tokens", "vllm:iteration_tokens_total", "vllm:request_params_n",
                  "vllm:request_params_max_tokens", "vllm:time_to_first_token_seconds",
                  "vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds",
                  "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                  "vllm:request_inference_time_seconds", "vllm:request_prefill_time_seconds",
                  "vllm:request_decode_time_seconds", "vllm:cache_config_info",
                  # added in vLLM 0.11 .. 0.33
                  "vllm:num_requests_waiting_by_reason", "vllm:engine_sleep_state",
                  "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits",
                  "vllm:mm_cache_queries", "vllm:mm_cache_hits",
                  "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_cached", "vllm:prompt_tokens_cached_by_source",
                  "vllm:request_max_num_generation_tokens", "vllm:request_prefill_kv_computed_tokens",
                  "vllm:request_num_preemptions", "vllm:admission_rejections"}
    assert len(vllm_names) == 36
    logger = PrometheusStatLogger("m", 512, {"block_size": "16"})
    exported = {f.name for f in logger.registry.collect()}
    ours = {n for n in exported if n.startswith("vllm:")}
    assert ours == vllm_names
    assert all(n.startswith(("vllm:", "minengine:")) for n in exported)
    assert "minengine:prompt_tokens_recomputed" in exported


@pytest.mark.parametrize("page, heading, min_blocks", [("README.md", "## Quick start", 1),
                                                       ("docs/quickstart.md", "## From Python", 3)])
def test_quick_start_runs(page, heading, min_blocks, monkeypatch, capsys):
    """The quick start's Python blocks (README and docs/quickstart.md; written to run on vLLM too) run as they are."""
    text = (ROOT / page).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    blocks = text[start:end if end >= 0 else len(text)].split("```python\n")[1:]
    assert len(blocks) >= min_blocks
    monkeypatch.chdir(ROOT)
    for block in blocks:
        code = block.split("```")[0]
        exec(compile(code, f"{page} quick start", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out.strip()
    assert os.getcwd() == str(ROOT)

"""Blocks a request holds over a long generation, with a sliding window, without one, and with both kinds of layer.

Two random-weight Mistral checkpoints with the same weights, one whose every layer has a window of ``--window``
tokens and one with full attention, each serve one request (a ``--prompt-len`` prompt, ``--output-len`` greedy
tokens) on the CPU; after every step the benchmark records the tokens computed and the KV blocks held. With full
attention the blocks grow with the request (``ceil(tokens / block_size)``); with the window the windowed KV cache
manager frees the blocks behind it and a decode step holds at most ``1 + ceil((window - 1) / block_size)``
(``core/windowed_kv_cache_manager.max_blocks_held``), which the benchmark checks. A third, mixed checkpoint (a
random-weight Qwen2 whose layer 0 has full attention and layer 1 the window, ``max_window_layers=1``) serves the
same request with two KV cache groups (``core/hybrid_kv_cache_manager.py``): the benchmark records each group's
blocks and checks that the full-attention group's grow with the request while the windowed group's stay within
the same decode bound. It writes a JSON of the series, a markdown summary and a plotly figure (PNG, when kaleido
is installed) to ``--out``.

    python benchmarks/sliding_window.py                      # window 128, blocks of 16, 200 + 1,000 tokens
    python benchmarks/sliding_window.py --window 32 --output-len 300 --out /tmp/sw
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minengine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from minengine.core.kv_cache_manager import cdiv  # noqa: E402
from minengine.core.windowed_kv_cache_manager import max_blocks_held  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def save_models(out: Path, window: int, max_len: int) -> dict[str, str]:
    """A random-weight Mistral with a window on every layer, the same weights with full attention, and a
    random-weight Qwen2 with a full-attention layer and a windowed one ("mixed")."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    paths = {}
    for name, sliding_window in (("windowed", window), ("full", None)):
        torch.manual_seed(0)
        cfg = MistralConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_len,
                            sliding_window=sliding_window, bos_token_id=1, eos_token_id=2)
        path = out / name
        MistralForCausalLM(cfg).save_pretrained(path)
        paths[name] = str(path)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_len,
                      use_sliding_window=True, sliding_window=window, max_window_layers=1, bos_token_id=1,
                      eos_token_id=2)
    Qwen2ForCausalLM(cfg).save_pretrained(out / "mixed")
    paths["mixed"] = str(out / "mixed")
    return paths


def blocks_held(kv) -> dict:
    """The blocks the pool has handed out: {"blocks": n}, or with two KV cache groups (a
    ``HybridKVCacheManager``) {"blocks": the full-attention group's, "windowed_blocks": the windowed group's}."""
    windowed = getattr(kv, "windowed", None)
    if windowed is None:
        return {"blocks": kv.num_used_blocks}
    return {"blocks": kv.pool.num_blocks - kv.pool.num_free_blocks, "windowed_blocks": windowed.num_used_blocks}


def blocks_over_generation(model: str, prompt: list[int], output_len: int, block_size: int,
                           chunk: int) -> tuple[list[dict], list[int]]:
    """One request served alone: after every step but the last (which frees everything), its tokens computed and
    the blocks the pool has handed out. Returns (the rows, the tokens it generated)."""
    engine = LLMEngine(EngineConfig(model=model, block_size=block_size, max_num_batched_tokens=chunk,
                                    max_model_len=len(prompt) + output_len, num_cpu_threads=1))
    engine.add_request("r", {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True))
    rows, tokens = [], []
    while engine.has_unfinished_requests():
        request = engine.scheduler.requests["r"]
        decode = request.num_computed_tokens >= request.num_prompt_tokens
        outputs = engine.step()
        tokens = outputs[-1].outputs[0].token_ids if outputs else tokens
        if engine.has_unfinished_requests():  # (the last step frees everything)
            rows.append({"computed": request.num_computed_tokens, **blocks_held(engine.kv_cache_manager),
                         "decode": decode})
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks  # every block free at the end
    return rows, list(tokens)


def run(window: int, block_size: int, prompt_len: int, output_len: int, chunk: int) -> dict:
    prompt = torch.randint(3, 512, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        paths = save_models(Path(tmp), window, prompt_len + output_len)
        series = {name: blocks_over_generation(path, prompt, output_len, block_size, chunk)
                  for name, path in paths.items()}
    bound = max_blocks_held(window, block_size)
    windowed, full = series["windowed"][0], series["full"][0]
    held_in_decodes = max(r["blocks"] for r in windowed if r["decode"])
    assert held_in_decodes == bound, (held_in_decodes, bound)  # the bound holds, and is reached
    assert all(r["blocks"] == cdiv(r["computed"], block_size) for r in full)  # full attention keeps them all
    mixed = series["mixed"][0]
    mixed_in_decodes = max(r["windowed_blocks"] for r in mixed if r["decode"])
    assert mixed_in_decodes == bound, (mixed_in_decodes, bound)  # the windowed group: the same bound, reached
    assert all(r["blocks"] == cdiv(r["computed"], block_size) for r in mixed)  # the full group keeps them all
    return {"window": window, "block_size": block_size, "prompt_len": prompt_len, "output_len": output_len,
            "chunk": chunk, "decode_bound": bound, "max_blocks_windowed_decode": held_in_decodes,
            "max_blocks_windowed": max(r["blocks"] for r in windowed),
            "max_blocks_full": max(r["blocks"] for r in full),
            "max_blocks_mixed_full_group": max(r["blocks"] for r in mixed),
            "max_blocks_mixed_windowed_group": max(r["windowed_blocks"] for r in mixed),
            "max_blocks_mixed_windowed_group_decode": mixed_in_decodes, "mixed": mixed,
            "tokens_differ": series["windowed"][1] != series["full"][1], "windowed": windowed, "full": full}


def write(result: dict, out: Path, png: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sliding_window.json").write_text(json.dumps(result) + "\n")
    r = result
    (out / "sliding_window.md").write_text(
        f"One request, a {r['prompt_len']}-token prompt (chunks of {r['chunk']}) and {r['output_len']} greedy tokens, "
        f"blocks of {r['block_size']} tokens, a random-weight 2-layer Mistral:\n\n"
        "| attention | most blocks held (any step) | most blocks held (decode steps) |\n|---|---|---|\n"
        f"| window of {r['window']} tokens | {r['max_blocks_windowed']} | {r['max_blocks_windowed_decode']} "
        f"(bound 1 + ceil(({r['window']} - 1) / {r['block_size']}) = {r['decode_bound']}) |\n"
        f"| full | {r['max_blocks_full']} | {r['max_blocks_full']} |\n\n"
        "The same request on a random-weight 2-layer Qwen2 whose layer 0 has full attention and layer 1 the window "
        "(two KV cache groups, one block table each):\n\n"
        "| KV cache group | most blocks held (any step) | most blocks held (decode steps) |\n|---|---|---|\n"
        f"| full-attention layers | {r['max_blocks_mixed_full_group']} | {r['max_blocks_mixed_full_group']} |\n"
        f"| windowed layers | {r['max_blocks_mixed_windowed_group']} | "
        f"{r['max_blocks_mixed_windowed_group_decode']} (the same bound, {r['decode_bound']}) |\n")
    import plotly.graph_objects as go

    fig = go.Figure()
    for name in ("full", "windowed"):
        rows = r[name]
        fig.add_trace(go.Scatter(x=[row["computed"] for row in rows], y=[row["blocks"] for row in rows],
                                 mode="lines", name=f"{name} attention" if name == "full" else
                                 f"window of {r['window']} tokens"))
    for key, label in (("blocks", "mixed: full-attention group"), ("windowed_blocks", "mixed: windowed group")):
        fig.add_trace(go.Scatter(x=[row["computed"] for row in r["mixed"]], y=[row[key] for row in r["mixed"]],
                                 mode="lines", line_dash="dash", name=label))
    fig.add_hline(y=r["decode_bound"], line_dash="dot", annotation_text="decode bound")
    fig.update_layout(xaxis_title="tokens computed", yaxis_title="KV blocks held", width=720, height=400,
                      title=f"KV blocks held by one request (blocks of {r['block_size']} tokens)")
    if not png:
        return
    try:
        fig.write_image(out / "sliding_window.png", scale=1)
        if out == RESULTS:  # the page on sliding windows shows it
            shutil.copyfile(RESULTS / "sliding_window.png", DOCS_IMG / "sliding_window.png")
    except Exception as exc:  # kaleido (and a browser) are optional
        print(f"no PNG ({type(exc).__name__}: {exc})")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--output-len", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=64, help="max_num_batched_tokens: the prompt's chunks")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for sliding_window.{json,md,png}")
    ap.add_argument("--no-png", action="store_true", help="skip the PNG (kaleido starts a browser: seconds)")
    a = ap.parse_args(argv)
    result = run(a.window, a.block_size, a.prompt_len, a.output_len, a.chunk)
    write(result, a.out, png=not a.no_png)
    print((a.out / "sliding_window.md").read_text())
    return result


if __name__ == "__main__":
    main()

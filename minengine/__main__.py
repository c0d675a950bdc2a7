"""Command line: ``python -m minengine run`` serves a batch of real prompts; ``generate`` prints one completion."""

from __future__ import annotations

import argparse
import random
import sys

from minengine.config import EngineConfig
from minengine.engine.llm_engine import LLMEngine
from minengine.sampling_params import SamplingParams
from minengine.workloads import SHAKESPEARE_OPENINGS, find_data_dir, load_real_prompts


def _engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine (EngineConfig)")
    g.add_argument("--model", default=None, help="HF checkpoint dir or hub id (default: the bundled tiny model)")
    g.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    g.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--num-kv-blocks", type=int, default=None, help="KV blocks in the pool (default: derived)")
    g.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget per step")
    g.add_argument("--max-num-seqs", type=int, default=32, help="sequence slots")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--no-chunked-prefill", action="store_true", help="prefill each prompt in one step")
    g.add_argument("--long-prefill-token-threshold", type=int, default=0, help="largest prefill chunk (0 = no cap)")
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--seed", type=int, default=0)


def _config(a: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=a.model, dtype=a.dtype, device=a.device, block_size=a.block_size, num_kv_blocks=a.num_kv_blocks,
        max_num_batched_tokens=a.max_num_batched_tokens, max_num_seqs=a.max_num_seqs,
        max_model_len=a.max_model_len, enable_chunked_prefill=not a.no_chunked_prefill,
        long_prefill_token_threshold=a.long_prefill_token_threshold,
        enable_prefix_caching=not a.no_prefix_caching, seed=a.seed)


def cmd_run(a: argparse.Namespace) -> None:
    from tqdm.auto import tqdm

    engine = LLMEngine(_config(a))
    data_dir = find_data_dir(a.data_dir)
    rng = random.Random(a.seed)
    prompts = [SHAKESPEARE_OPENINGS[i % len(SHAKESPEARE_OPENINGS)] for i in range(a.num_prompts)]
    real = load_real_prompts(data_dir, limit=a.num_real_prompts, max_chars=a.max_prompt_chars)
    prompts += real
    print(f"model: {engine.model_path}  ({sum(p.numel() for p in engine.model.parameters()):,} parameters, "
          f"{engine.config.dtype}, {engine.runner.device})")
    print(f"KV pool: {engine.num_kv_blocks} blocks x {engine.config.block_size} tokens "
          f"({engine.kv_cache_bytes / 2**20:.1f} MiB); token budget {engine.config.max_num_batched_tokens}; "
          f"{engine.config.max_num_seqs} sequence slots")
    print(f"workload: {a.num_prompts} Shakespeare openings + {len(real)} real prompts"
          + (f" from {data_dir / 'prompts'}" if real else " (no shared/data/prompts found)"))
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=a.temperature, top_p=a.top_p, max_tokens=rng.randint(a.min_tokens,
                                a.max_tokens), seed=a.seed + i if a.temperature > 0 else None)
        engine.add_request(str(i), prompt, params)
    done = {}
    with tqdm(total=len(prompts), desc="requests") as bar:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out
                    bar.update(1)
    for rid in list(done)[: a.show]:
        out = done[rid]
        print(f"\n--- request {rid} ({len(out.prompt_token_ids)} prompt tokens, "
              f"{len(out.outputs[0].token_ids)} generated, finish: {out.outputs[0].finish_reason}) ---")
        print((out.prompt or "")[-200:] + "\033[1m" + out.outputs[0].text + "\033[0m")
    print("\n" + engine.summary().as_table())


def cmd_generate(a: argparse.Namespace) -> None:
    engine = LLMEngine(_config(a))
    params = SamplingParams(temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens,
                            seed=a.seed if a.temperature > 0 else None)
    engine.add_request("0", a.prompt, params)
    printed = 0
    while engine.has_unfinished_requests():
        for out in engine.step():  # stream the text as it grows
            text = out.outputs[0].text
            if not text.endswith("\ufffd"):
                sys.stdout.write(text[printed:])
                sys.stdout.flush()
                printed = len(text)
    print()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m minengine", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="serve a batch of real prompts and print a summary")
    _engine_args(r)
    r.add_argument("--num-prompts", type=int, default=32, help="Shakespeare openings to serve")
    r.add_argument("--num-real-prompts", type=int, default=16, help="real prompts from shared/data/prompts")
    r.add_argument("--max-prompt-chars", type=int, default=2000)
    r.add_argument("--data-dir", default=None, help="the shared/data folder (default: ../shared/data)")
    r.add_argument("--min-tokens", type=int, default=32)
    r.add_argument("--max-tokens", type=int, default=96)
    r.add_argument("--temperature", type=float, default=0.8)
    r.add_argument("--top-p", type=float, default=0.95)
    r.add_argument("--show", type=int, default=3, help="completions to print")
    r.set_defaults(func=cmd_run)
    g = sub.add_parser("generate", help="print one completion")
    g.add_argument("prompt")
    _engine_args(g)
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.set_defaults(func=cmd_generate)
    a = p.parse_args(argv)
    try:
        a.func(a)
    except ValueError as exc:
        p.exit(2, f"error: {exc}\n")


if __name__ == "__main__":
    main()

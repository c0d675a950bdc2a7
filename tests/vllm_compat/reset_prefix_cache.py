"""vLLM's ``llm_engine_reset_kv.py``: an ``LLMEngine`` step loop (its flags from ``EngineArgs.add_cli_args`` and
``vllm.utils.argparse_utils``) that resets the prefix cache mid-run with ``reset_running_requests=True``: the
running requests are preempted and recomputed, and greedy outputs are the same as without the reset."""

import os

from minengine import EngineArgs, LLMEngine, SamplingParams
from minengine.utils.argparse_utils import FlexibleArgumentParser

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")
PROMPTS = ["ROMEO:\nBut, soft! what light " * 6, "ROMEO:\nBut, soft! what light " * 6, "HAMLET:\nTo be, or not to be,"]


def run(engine: LLMEngine, reset_at: int | None) -> dict[str, list[int]]:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=24, logprobs=1))
    done, step = {}, 0
    while engine.has_unfinished_requests():
        if step == reset_at:
            assert engine.reset_prefix_cache(reset_running_requests=True)
            print(f"reset the prefix cache at step {step}")
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
                print(out.request_id, repr(out.outputs[0].text))
        step += 1
    return done


def main():
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(description="reset the prefix cache mid-run"))
    args = parser.parse_args(["--model", MODEL, "--max-model-len", "512", "--max_num_batched_tokens", "64"])
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))
    assert run(engine, reset_at=None) == run(engine, reset_at=3)


if __name__ == "__main__":
    main()

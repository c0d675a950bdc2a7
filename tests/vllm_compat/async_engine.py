"""vLLM's async engine: AsyncLLMEngine.from_engine_args, then `async for` over generate()."""

import asyncio
import os

from minengine import AsyncEngineArgs, AsyncLLMEngine, SamplingParams

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")


async def stream(engine, prompt, request_id):
    params = SamplingParams(temperature=0, max_tokens=16)
    final = None
    async for output in engine.generate(prompt, params, request_id):
        final = output
    return final


async def main():
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=MODEL, max_model_len=512))
    try:
        outputs = await asyncio.gather(*(stream(engine, p, f"req-{i}") for i, p in enumerate(["ROMEO:", "JULIET:"])))
        for output in outputs:
            print(f"{output.request_id}: {output.outputs[0].text!r}")
            assert output.finished and len(output.outputs[0].token_ids) == 16
    finally:
        engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main())

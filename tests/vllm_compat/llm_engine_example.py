"""vLLM's LLMEngine example: engine flags from the command line, add_request, then step() until done."""

import argparse
import os

from minengine import EngineArgs, LLMEngine, RequestOutput, SamplingParams

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")


def create_test_prompts() -> list[tuple[str, SamplingParams]]:
    return [
        ("A robot may not injure a human being", SamplingParams(temperature=0.0, logprobs=1, prompt_logprobs=1)),
        ("To be or not to be,", SamplingParams(temperature=0.8, top_k=5, presence_penalty=0.2)),
        ("What is the meaning of life?", SamplingParams(n=2, temperature=0.8, top_p=0.95, frequency_penalty=0.1)),
    ]


def process_requests(engine: LLMEngine, test_prompts: list[tuple[str, SamplingParams]]) -> int:
    request_id = 0
    finished = 0
    while test_prompts or engine.has_unfinished_requests():
        if test_prompts:
            prompt, sampling_params = test_prompts.pop(0)
            engine.add_request(str(request_id), prompt, sampling_params)
            request_id += 1
        request_outputs: list[RequestOutput] = engine.step()
        for request_output in request_outputs:
            if request_output.finished:
                print(request_output)
                finished += 1
    return finished


def main(args: argparse.Namespace):
    engine_args = EngineArgs.from_cli_args(args)
    engine = LLMEngine.from_engine_args(engine_args)
    assert process_requests(engine, create_test_prompts()) == 3


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Demo on using the LLMEngine class directly")
    parser = EngineArgs.add_cli_args(parser)
    parser.set_defaults(model=MODEL, max_model_len=512)
    main(parser.parse_args())

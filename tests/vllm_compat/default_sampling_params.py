"""vLLM's generation-config defaults: start from llm.get_default_sampling_params() and adjust."""

import os

from minengine import LLM

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")


def main():
    llm = LLM(model=MODEL)
    sampling_params = llm.get_default_sampling_params()
    sampling_params.max_tokens = 10
    sampling_params.temperature = 0
    outputs = llm.generate(["ROMEO:", "JULIET:"], sampling_params)
    for output in outputs:
        print(f"{output.prompt!r} -> {output.outputs[0].text!r}")
        assert len(output.outputs[0].token_ids) == 10


if __name__ == "__main__":
    main()

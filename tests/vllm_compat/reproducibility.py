"""vLLM's reproducibility example: the same seed gives the same samples, run after run."""

import os

from minengine import LLM, SamplingParams

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")
SEED = 42
prompts = ["ROMEO:", "JULIET:", "HAMLET:", "OTHELLO:"]


def run():
    llm = LLM(model=MODEL, seed=SEED)
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=20)
    outputs = llm.generate(prompts, sampling_params)
    per_request = llm.generate(prompts, [SamplingParams(temperature=1.0, seed=SEED + i, max_tokens=20)
                                         for i in range(len(prompts))])
    return [o.outputs[0].text for o in outputs], [o.outputs[0].text for o in per_request]


def main():
    first, second = run(), run()
    for text in first[0]:
        print(repr(text))
    print(f"Same outputs across runs: {first == second}")
    assert first == second


if __name__ == "__main__":
    main()

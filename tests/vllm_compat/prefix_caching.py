"""vLLM's prefix caching example: the same outputs with and without automatic prefix caching."""

import os

from minengine import LLM, SamplingParams

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")
prefix = ("The scene is a public place in Verona. Two households, both alike in dignity, have quarrelled for "
          "years, and their servants meet in the street with swords drawn. ") * 3
prompts = ["ROMEO:", "JULIET:", "MERCUTIO:", "BENVOLIO:"]
generating_prompts = [prefix + prompt for prompt in prompts]
sampling_params = SamplingParams(temperature=0.0, max_tokens=24)


def main():
    regular_llm = LLM(model=MODEL, gpu_memory_utilization=0.4)
    outputs = regular_llm.generate(generating_prompts, sampling_params)
    regular_generated_texts = [output.outputs[0].text for output in outputs]
    del regular_llm

    prefix_cached_llm = LLM(model=MODEL, enable_prefix_caching=True, gpu_memory_utilization=0.4)
    prefix_cached_llm.generate(generating_prompts[0], sampling_params)  # warm up: fills the cache
    outputs = prefix_cached_llm.generate(generating_prompts, sampling_params)
    cached_generated_texts = [output.outputs[0].text for output in outputs]
    for prompt, text in zip(prompts, cached_generated_texts):
        print(f"Prompt: {prompt!r}, Generated text: {text!r}")
    generated_same = all(r == c for r, c in zip(regular_generated_texts, cached_generated_texts))
    print(f"Generated answers are the same: {generated_same}")
    assert generated_same
    print(f"Cached tokens of the last request: {outputs[-1].num_cached_tokens}")
    assert outputs[-1].num_cached_tokens > 0


if __name__ == "__main__":
    main()

"""vLLM's basic example: generate from a list of prompts."""

import os

from minengine import LLM, SamplingParams

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")
prompts = ["ROMEO:", "JULIET:\nO Romeo, Romeo!", "KING RICHARD III:\nNow is the winter", "HAMLET:\nTo be, or not"]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)


def main():
    llm = LLM(model=MODEL)
    outputs = llm.generate(prompts, sampling_params)
    print("\nGenerated Outputs:\n" + "-" * 60)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt:    {prompt!r}")
        print(f"Output:    {generated_text!r}")
        print("-" * 60)
        assert output.finished and len(output.outputs[0].token_ids) <= 16


if __name__ == "__main__":
    main()

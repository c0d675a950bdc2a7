"""vLLM's chat example: LLM.chat with one conversation and a batch of them."""

import os

from minengine import LLM, SamplingParams

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")


def print_outputs(outputs):
    print("\nGenerated Outputs:\n" + "-" * 80)
    for output in outputs:
        print(f"Prompt: {output.prompt!r}\n")
        print(f"Generated text: {output.outputs[0].text!r}")
        print("-" * 80)


def main():
    llm = LLM(model=MODEL)
    sampling_params = SamplingParams(max_tokens=32, temperature=0)
    conversation = [
        {"role": "system", "content": "A public place in Verona."},
        {"role": "user", "content": "Good morrow, cousin."},
        {"role": "assistant", "content": "Is the day so young?"},
        {"role": "user", "content": "But new struck nine."},
    ]
    outputs = llm.chat(conversation, sampling_params, use_tqdm=False)
    print_outputs(outputs)
    conversations = [conversation for _ in range(4)]
    batch = llm.chat(conversations, sampling_params, use_tqdm=True)
    print_outputs(batch)
    assert all(o.outputs[0].text == outputs[0].outputs[0].text for o in batch)


if __name__ == "__main__":
    main()

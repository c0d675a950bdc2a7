"""Parallel sampling: n completions of one prompt, numbered by .index."""

import os

from minengine import LLM, SamplingParams

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")


def main():
    llm = LLM(model=MODEL)
    params = SamplingParams(n=4, temperature=0.9, top_p=0.95, max_tokens=16, seed=7)
    outputs = llm.generate(["ROMEO:", "JULIET:"], params)
    for output in outputs:
        print(f"Prompt: {output.prompt!r}")
        for completion in output.outputs:
            print(f"  [{completion.index}] {completion.text!r} ({completion.finish_reason})")
        assert [c.index for c in output.outputs] == [0, 1, 2, 3]
        assert len({c.text for c in output.outputs}) > 1
    again = llm.generate(["ROMEO:", "JULIET:"], params)
    assert [c.text for c in again[0].outputs] == [c.text for c in outputs[0].outputs]  # seeded


if __name__ == "__main__":
    main()

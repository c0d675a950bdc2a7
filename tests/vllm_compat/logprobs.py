"""Logprobs of the generated and the prompt tokens, as vLLM returns them."""

import math
import os

from minengine import LLM, SamplingParams

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")


def main():
    llm = LLM(model=MODEL)
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=5, prompt_logprobs=3)
    (output,) = llm.generate(["ROMEO:\nO, she doth teach the torches to burn bright!"], params)
    completion = output.outputs[0]
    print(f"text: {completion.text!r}, cumulative logprob: {completion.cumulative_logprob:.3f}")
    for token_id, position in zip(completion.token_ids, completion.logprobs):
        chosen = position[token_id]
        print(f"  {chosen.decoded_token!r}: logprob {chosen.logprob:.3f}, rank {chosen.rank}; top: "
              + ", ".join(f"{lp.decoded_token!r} {lp.logprob:.2f}" for lp in position.values()))
        assert chosen.rank == 1 and len(position) == 5  # greedy: the chosen token is the most likely
    assert math.isclose(completion.cumulative_logprob,
                        sum(p[t].logprob for t, p in zip(completion.token_ids, completion.logprobs)), abs_tol=1e-6)
    assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(output.prompt_token_ids)
    for token_id, position in zip(output.prompt_token_ids[1:4], output.prompt_logprobs[1:4]):
        print(f"  prompt token {token_id}: {position[token_id].logprob:.3f}")


if __name__ == "__main__":
    main()

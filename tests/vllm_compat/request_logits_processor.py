"""vLLM's request-level logits processor examples (offline_inference/logits_processor/custom_req*.py): a
per-request callable ``(output_ids, logits_row) -> row`` wrapped into a batch processor by
``AdapterLogitsProcessor``; requests whose ``extra_args`` name a ``target_token`` can only produce it."""

import os

import torch

from minengine import LLM, SamplingParams
from minengine.logger import init_logger
from minengine.v1.sample.logits_processor import AdapterLogitsProcessor, RequestLogitsProcessor

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")
logger = init_logger(__name__)


class OnlyToken:
    """A request-level processor: every logit but the target's is -inf."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        kept = logits[self.token].item()
        logits[:] = float("-inf")
        logits[self.token] = kept
        return logits


class TargetTokenAdapter(AdapterLogitsProcessor):
    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: SamplingParams) -> RequestLogitsProcessor | None:
        token = (params.extra_args or {}).get("target_token")
        if token is not None and not isinstance(token, int):
            logger.warning("target_token %r is not an int: not applied", token)
            return None
        return None if token is None else OnlyToken(token)


prompts = ["ROMEO:", "JULIET:\nO Romeo, Romeo!", "KING RICHARD III:\nNow is the winter", "HAMLET:\nTo be, or not"]
params = [SamplingParams(temperature=0.0, max_tokens=12, extra_args={"target_token": 65}),
          SamplingParams(temperature=0.0, max_tokens=12),
          SamplingParams(temperature=0.0, max_tokens=12, extra_args={"target_token": "x"}),
          SamplingParams(temperature=0.0, max_tokens=12, extra_args={"target_token": 67})]


def main():
    llm = LLM(model=MODEL, logits_processors=[TargetTokenAdapter])
    outputs = llm.generate(prompts, params)
    plain = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12))
    for output, p, reference in zip(outputs, params, plain):
        print(f"Prompt: {output.prompt!r}\nOutput: {output.outputs[0].text!r}")
        token = (p.extra_args or {}).get("target_token")
        if isinstance(token, int):
            assert output.outputs[0].token_ids == [token] * 12
        else:  # not applied: what the engine gives without it
            assert output.outputs[0].token_ids == reference.outputs[0].token_ids


if __name__ == "__main__":
    main()

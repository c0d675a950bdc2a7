"""vLLM's custom logits processor example (offline_inference/logits_processor): a v1 ``LogitsProcessor`` class
passed to ``LLM(logits_processors=[...])``; requests that carry ``extra_args={"target_token": t}`` can only
produce t, the others are untouched."""

import os

import torch

from minengine import LLM, SamplingParams
from minengine.config import VllmConfig
from minengine.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from minengine.v1.sample.logits_processor.builtin import process_dict_updates

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")


class TargetTokenProcessor(LogitsProcessor):
    """Keeps only the logit of ``extra_args["target_token"]`` in the rows of the requests that set it."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        self.targets: dict[int, int] = {}  # batch index -> target token

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None):
        process_dict_updates(self.targets, batch_update,
                             lambda params, _prompt, _output: (params.extra_args or {}).get("target_token"))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.targets:
            return logits
        rows = torch.tensor(list(self.targets), dtype=torch.long, device=logits.device)
        cols = torch.tensor(list(self.targets.values()), dtype=torch.long, device=logits.device)
        kept = logits[rows, cols].clone()
        logits[rows] = float("-inf")
        logits[rows, cols] = kept
        return logits


prompts = ["ROMEO:", "JULIET:\nO Romeo, Romeo!", "KING RICHARD III:\nNow is the winter", "HAMLET:\nTo be, or not"]
sampling_params_list = [
    SamplingParams(temperature=0.0, extra_args={"target_token": 65}),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, extra_args={"target_token": 67}),
    SamplingParams(temperature=0.0),
]


def main():
    llm = LLM(model=MODEL, logits_processors=[TargetTokenProcessor])
    outputs = llm.generate(prompts, sampling_params_list)
    plain = llm.generate(prompts, [SamplingParams(temperature=0.0)] * len(prompts))
    print("\nGenerated Outputs:\n" + "-" * 60)
    for output, params, reference in zip(outputs, sampling_params_list, plain):
        print(f"Prompt:    {output.prompt!r}")
        print(f"Output:    {output.outputs[0].text!r}")
        print("-" * 60)
        target = (params.extra_args or {}).get("target_token")
        if target is None:  # untouched: exactly what the engine gives without the processor's target
            assert output.outputs[0].token_ids == reference.outputs[0].token_ids
        else:
            assert set(output.outputs[0].token_ids) == {target}


if __name__ == "__main__":
    main()

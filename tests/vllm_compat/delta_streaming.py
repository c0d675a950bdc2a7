"""Streaming with RequestOutputKind.DELTA through the LLMEngine step loop: each output carries only new text."""

import os

from minengine import EngineArgs, LLMEngine, SamplingParams
from minengine.sampling_params import RequestOutputKind

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")


def main():
    engine = LLMEngine.from_engine_args(EngineArgs(model=MODEL, max_model_len=512))
    params = SamplingParams(temperature=0, max_tokens=24, output_kind=RequestOutputKind.DELTA)
    engine.add_request("0", "ROMEO:", params)
    pieces, token_ids = [], []
    while engine.has_unfinished_requests():
        for output in engine.step():
            pieces.append(output.outputs[0].text)
            token_ids += output.outputs[0].token_ids
            print(repr(output.outputs[0].text), end=" ", flush=True)
    print()
    assert "".join(pieces) == engine.get_tokenizer().decode(token_ids) and len(token_ids) == 24


if __name__ == "__main__":
    main()

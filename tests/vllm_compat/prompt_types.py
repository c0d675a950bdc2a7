"""Prompts as text, TextPrompt and TokensPrompt give the same completion."""

import os

from minengine import LLM, SamplingParams, TextPrompt, TokensPrompt

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")


def main():
    llm = LLM(model=MODEL)
    tokenizer = llm.get_tokenizer()
    text = "KING RICHARD III:\nNow is the winter of our discontent"
    params = SamplingParams(temperature=0, max_tokens=12)
    outputs = llm.generate([text, TextPrompt(prompt=text),
                            TokensPrompt(prompt_token_ids=tokenizer(text)["input_ids"])], params)
    texts = [o.outputs[0].text for o in outputs]
    print(texts)
    assert texts[0] == texts[1] == texts[2]


if __name__ == "__main__":
    main()

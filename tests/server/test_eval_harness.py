"""What evaluation harnesses send to ``/v1/completions``: lm-evaluation-harness's exact request shapes
(``local-completions``: loglikelihood = ``echo`` + ``logprobs`` + ``max_tokens`` 1, generate_until), parsed the
way lm-eval parses them, against the offline API; vLLM's ``echo`` + ``max_tokens: 0``; the routes lm-eval probes
(``/tokenizer_info``, ``/tokenize``). No lm-eval needed: the payloads are written out here as lm-eval 0.4.13
builds them (``lm_eval/models/openai_completions.py``)."""

from __future__ import annotations

import json
from operator import itemgetter

import httpx
import pytest

from minengine import SamplingParams, TokensPrompt
from minengine.entrypoints.cli_args import FrontendArgs

TIMEOUT = 60.0
MODEL = "tiny-shakespeare-llama"
# (context, continuation) pairs as a multiple-choice task scores them
PAIRS = [("ROMEO:\nBut soft, what light", " through yonder window breaks"),
         ("ROMEO:\nBut soft, what light", " is this, my lord"),
         ("JULIET:\nO Romeo, Romeo,", " wherefore art thou Romeo?"),
         ("First Citizen:\nBefore we proceed", " any further, hear me speak.")]


# the settings of this module's ``server`` fixture (tests/conftest.py)
SERVER_FRONTEND = FrontendArgs(enable_tokenizer_info_endpoint=True)


def _encode(ref, pairs):
    """lm-eval's tokenization of a loglikelihood request: context and continuation separately, no special
    tokens (the tokenizer adds none to this model anyway), the whole = context + continuation."""
    tok = ref.get_tokenizer()
    out = []
    for ctx, cont in pairs:
        c, w = tok(ctx, add_special_tokens=False)["input_ids"], tok(cont, add_special_tokens=False)["input_ids"]
        out.append((c + w, len(c)))
    return out


def lm_eval_loglikelihood_payload(prompts) -> dict:
    """``LocalCompletionsAPI._create_payload(generate=False)``."""
    return {"model": MODEL, "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
            "echo": True}


def lm_eval_parse_logprobs(out: dict, ctxlens: list[int]) -> list[tuple[float, bool]]:
    """``LocalCompletionsAPI.parse_logprobs``: the continuation's summed logprob and whether it is greedy."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=itemgetter("index")), ctxlens):
        lps = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        res.append((sum(lps), all(tok == max(top.values()) for tok, top in zip(lps, tops))))
    return res


def _offline(ref, ids: list[int], ctxlen: int) -> tuple[float, bool]:
    (out,) = ref.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, prompt_logprobs=1,
                                                                               temperature=0), use_tqdm=False)
    positions = out.prompt_logprobs[ctxlen:]
    return sum(p[t].logprob for p, t in zip(positions, ids[ctxlen:])), all(
        p[t].rank == 1 for p, t in zip(positions, ids[ctxlen:]))


def test_lm_eval_loglikelihood_requests_match_the_offline_prompt_logprobs(server, ref):
    encoded = _encode(ref, PAIRS)
    r = httpx.post(server.url + "/v1/completions", json=lm_eval_loglikelihood_payload([ids for ids, _ in encoded]),
                   timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    body = r.json()
    tok = ref.get_tokenizer()
    for choice, (ids, _) in zip(sorted(body["choices"], key=itemgetter("index")), encoded):
        lp = choice["logprobs"]
        # vLLM's shape: prompt + the one generated token; the first prompt token has no logprob
        assert len(lp["token_logprobs"]) == len(lp["tokens"]) == len(lp["top_logprobs"]) == len(ids) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(x is not None and x <= 0 for x in lp["token_logprobs"][1:])
        assert all(1 <= len(top) <= 2 for top in lp["top_logprobs"][1:])  # the token itself + the top 1
        assert choice["text"].startswith(tok.decode(ids)) and "".join(lp["tokens"]) == choice["text"]
        assert lp["text_offset"][0] == 0
    got = lm_eval_parse_logprobs(body, [ctxlen for _, ctxlen in encoded])
    for (ll, greedy), (ids, ctxlen) in zip(got, encoded):
        want_ll, want_greedy = _offline(ref, ids, ctxlen)
        assert ll == pytest.approx(want_ll, abs=1e-4) and greedy == want_greedy
    assert got[0][0] != got[1][0]  # two continuations of one context: the comparison a multiple-choice task makes
    # lm-eval's text form (tokenized_requests=False): the same numbers
    texts = [ctx + cont for ctx, cont in PAIRS]
    r2 = httpx.post(server.url + "/v1/completions", json=lm_eval_loglikelihood_payload(texts), timeout=TIMEOUT)
    by_text = [c["logprobs"]["token_logprobs"] for c in sorted(r2.json()["choices"], key=itemgetter("index"))]
    by_ids = [c["logprobs"]["token_logprobs"] for c in sorted(body["choices"], key=itemgetter("index"))]
    for a, b in zip(by_text, by_ids):
        assert a[0] is None and b[0] is None and a[1:] == pytest.approx(b[1:], abs=1e-5)
    server.wait_idle()
    assert server.engine.kv_cache_manager.num_free_blocks == server.engine.num_kv_blocks


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_0_returns_the_prompt_and_its_logprobs(server, ref, stream):
    """vLLM: ``echo`` + ``max_tokens: 0`` scores the prompt and returns it alone (text, tokens, logprobs)."""
    ids, _ = _encode(ref, PAIRS[:1])[0]
    body = {"model": MODEL, "prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 2, "temperature": 0}
    if stream:
        chunks = []
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True},
                          timeout=TIMEOUT) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks.extend(json.loads(line[6:])["choices"])
        text = "".join(c["text"] for c in chunks)
        lps = [x for c in chunks if c["logprobs"] for x in c["logprobs"]["token_logprobs"]]
        finish = chunks[-1]["finish_reason"]
    else:
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        (choice,) = r.json()["choices"]
        text, lps, finish = choice["text"], choice["logprobs"]["token_logprobs"], choice["finish_reason"]
        assert len(choice["logprobs"]["top_logprobs"][1]) >= 2
    assert text == ref.get_tokenizer().decode(ids)
    assert len(lps) == len(ids) and lps[0] is None and finish == "length"
    (out,) = ref.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, prompt_logprobs=2,
                                                                               temperature=0), use_tqdm=False)
    assert lps[1:] == pytest.approx([p[t].logprob for p, t in zip(out.prompt_logprobs[1:], ids[1:])], abs=1e-4)
    # without echo, max_tokens 0 is still a bad request (vLLM too)
    r = httpx.post(server.url + "/v1/completions", json={**body, "echo": False}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_streamed_echo_logprobs_equal_the_unstreamed_ones(server):
    body = {"model": MODEL, "prompt": "ROMEO:\nBut soft", "max_tokens": 6, "echo": True, "logprobs": 1,
            "temperature": 0}
    plain = httpx.post(server.url + "/v1/completions", json=body, timeout=TIMEOUT).json()["choices"][0]
    chunks = []
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=TIMEOUT) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.extend(json.loads(line[6:])["choices"])
    assert "".join(c["text"] for c in chunks) == plain["text"]
    streamed = [x for c in chunks for x in c["logprobs"]["token_logprobs"]]
    assert streamed[0] is None and streamed[1:] == pytest.approx(plain["logprobs"]["token_logprobs"][1:], abs=1e-5)
    assert [t for c in chunks for t in c["logprobs"]["tokens"]] == plain["logprobs"]["tokens"]


def test_lm_eval_generate_until_request_matches_llm_generate(server, ref):
    """``_create_payload(generate=True)``: max_tokens from max_gen_toks, temperature 0, ``until`` as stop."""
    prompts = ["ROMEO:\n", "JULIET:\n"]
    payload = {"prompt": prompts, "model": MODEL, "max_tokens": 32, "temperature": 0, "stop": ["\n\n"],
               "seed": 1234}
    r = httpx.post(server.url + "/v1/completions", json=payload, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    got = [c["text"] for c in sorted(r.json()["choices"], key=itemgetter("index"))]
    want = ref.generate(prompts, SamplingParams(max_tokens=32, temperature=0, stop=["\n\n"], seed=1234),
                        use_tqdm=False)
    assert got == [o.outputs[0].text for o in want]


def test_lm_eval_remote_tokenizer_probe(server, ref):
    """``lm_eval.utils.check_remote_tokenizer_support``: /tokenizer_info with an ``eos_token``, then /tokenize."""
    info = httpx.get(server.url + "/tokenizer_info", timeout=TIMEOUT)
    assert info.status_code == 200
    info = info.json()
    tok = ref.get_tokenizer()
    assert info["eos_token"] == tok.eos_token and info["tokenizer_class"] == type(tok).__name__
    assert "vocab_file" not in info and json.dumps(info)
    r = httpx.post(server.url + "/tokenize", json={"prompt": "test", "add_special_tokens": False}, timeout=TIMEOUT)
    assert r.json()["tokens"] == tok("test", add_special_tokens=False)["input_ids"]
    r = httpx.post(server.url + "/detokenize", json={"tokens": r.json()["tokens"]}, timeout=TIMEOUT)
    assert r.json()["prompt"] == "test"


def test_the_local_lm_eval_tasks_are_built_from_held_out_text():
    """benchmarks/lm_eval_local.py's data: deterministic, from the validation 10 %, the files its yamls name."""
    import re

    from benchmarks.lm_eval_local import MC, SPEAKER, TASKS, make_tasks
    from minengine.workloads import find_data_dir

    data = find_data_dir(None)
    if data is None or not (data / "text" / "tinyshakespeare.txt").is_file():
        pytest.skip("shared/data/text/tinyshakespeare.txt not found")
    docs = make_tasks(data, 8, 6, seed=0)
    assert docs == make_tasks(data, 8, 6, seed=0)
    text = (data / "text" / "tinyshakespeare.txt").read_text()
    train = text[:int(len(text) * 0.9)]
    for doc in docs[MC]:
        assert len(doc["choices"]) == 4 and doc["choices"][doc["label"]] not in doc["context"]
        assert doc["context"] + doc["choices"][doc["label"]] not in train  # held out
    assert all(re.fullmatch(r"[A-Z][A-Za-z' ]*:", d["speaker"]) for d in docs[SPEAKER])
    for name in (MC, SPEAKER):
        assert f"data/{name}.jsonl" in (TASKS / f"{name}.yaml").read_text()
        assert len((TASKS / "data" / f"{name}.jsonl").read_text().splitlines()) == len(docs[name])

"""Penalties, min_tokens, min-p/top-k/top-p and logprobs checked against transformers' logits processors and
forward passes on the same weights (float32, CPU)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from minengine import LLM, SamplingParams
from minengine.worker.logits_processing import process_logits
from minengine.worker.penalties import apply_penalties
from tests.conftest import hf_model

PROMPTS = ["ROMEO:\nO, she doth teach the torches to burn bright!", "KING RICHARD III:\nNow is the winter",
           "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name;"]


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's presence and frequency penalties over the generated tokens (transformers has none)."""

    def __init__(self, prompt_len: int, presence: float, frequency: float):
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores):
        out = input_ids[:, self.prompt_len:]
        for b in range(scores.shape[0]):
            counts = torch.bincount(out[b], minlength=scores.shape[1]).to(scores.dtype)
            scores[b] -= self.frequency * counts + self.presence * (counts > 0).to(scores.dtype)
        return scores


@pytest.fixture(scope="module")
def llm(bundled_model):
    return LLM(bundled_model, max_model_len=512, max_num_batched_tokens=16)  # chunked prefill on the way


@pytest.fixture(scope="module")
def tok(llm):
    return llm.get_tokenizer()


def hf_generate(path, ids, max_new_tokens, **kwargs):
    model = hf_model(path)
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=0, **kwargs)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty_greedy_matches_transformers(bundled_model, llm, tok, penalty):
    params = SamplingParams(temperature=0, max_tokens=32, repetition_penalty=penalty, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    plain = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), use_tqdm=False)
    for p, o in zip(PROMPTS, outs):
        ids = tok(p)["input_ids"]
        want = hf_generate(bundled_model, ids, 32, repetition_penalty=penalty, eos_token_id=None)
        assert o.outputs[0].token_ids == want
    assert any(o.outputs[0].token_ids != q.outputs[0].token_ids for o, q in zip(outs, plain))  # it did something


@pytest.mark.parametrize("presence, frequency", [(0.8, 0.0), (0.0, 0.6), (0.5, 0.5), (-0.5, 0.2)])
def test_presence_frequency_penalties_greedy_match_a_transformers_processor(bundled_model, llm, tok, presence,
                                                                            frequency):
    params = SamplingParams(temperature=0, max_tokens=32, presence_penalty=presence, frequency_penalty=frequency,
                            ignore_eos=True)
    for p, o in zip(PROMPTS, llm.generate(PROMPTS, params, use_tqdm=False)):
        ids = tok(p)["input_ids"]
        want = hf_generate(bundled_model, ids, 32, eos_token_id=None,
                           logits_processor=LogitsProcessorList([OpenAIPenalties(len(ids), presence, frequency)]))
        assert o.outputs[0].token_ids == want


def test_min_tokens_matches_transformers(bundled_model, llm, tok):
    ids = tok(PROMPTS[1])["input_ids"]
    free = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].token_ids
    stop = free[1]  # greedy would stop at its 2nd token
    params = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop], min_tokens=6, ignore_eos=True)
    got = llm.generate(PROMPTS[1], params, use_tqdm=False)[0].outputs[0]
    want = hf_generate(bundled_model, ids, 20, eos_token_id=[stop], logits_processor=LogitsProcessorList(
        [MinNewTokensLengthLogitsProcessor(len(ids), 6, [stop])]))
    assert got.token_ids == want and len(got.token_ids) > 6
    assert got.token_ids[-1] == stop or len(got.token_ids) == 20


def _hf_warp(logits, *warpers):
    x = logits[None].clone()
    ids = torch.zeros((1, 1), dtype=torch.long)
    for w in warpers:
        x = w(ids, x)
    return x[0].softmax(-1)


@pytest.mark.parametrize("seed", range(6))
def test_sampling_distribution_matches_transformers_warpers(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2048, generator=g) * 3
    for t, k, p in [(0.7, 50, 0.9), (1.3, 0, 0.8), (0.5, 5, 1.0), (1.0, -1, 0.95)]:
        ours = process_logits(logits, SamplingParams(temperature=t, top_k=k, top_p=p), [], []).softmax(-1)
        warpers = [TemperatureLogitsWarper(t)] + ([TopKLogitsWarper(k)] if k > 0 else []) + \
            ([TopPLogitsWarper(p)] if p < 1 else [])
        torch.testing.assert_close(ours, _hf_warp(logits, *warpers), atol=1e-6, rtol=1e-5)
    for t, m in [(0.8, 0.05), (1.5, 0.2)]:
        ours = process_logits(logits, SamplingParams(temperature=t, min_p=m), [], []).softmax(-1)
        torch.testing.assert_close(ours, _hf_warp(logits, TemperatureLogitsWarper(t), MinPLogitsWarper(m)),
                                   atol=1e-6, rtol=1e-5)
    prompt, output = torch.randint(0, 2048, (30,), generator=g).tolist(), torch.randint(0, 2048, (20,),
                                                                                       generator=g).tolist()
    ours = apply_penalties(logits, prompt, output, SamplingParams(repetition_penalty=1.7))
    hf = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([prompt + output]), logits[None].clone())[0]
    torch.testing.assert_close(ours, hf)


def _hf_logprobs(path, ids):
    with torch.no_grad():
        return torch.log_softmax(hf_model(path)(torch.tensor([ids])).logits[0].float(), -1)


def test_logprobs_match_transformers_and_are_raw(bundled_model, llm, tok):
    cases = [SamplingParams(temperature=0, max_tokens=16, logprobs=5, ignore_eos=True),
             SamplingParams(temperature=1.2, top_k=20, top_p=0.9, seed=3, max_tokens=16, logprobs=5,
                            repetition_penalty=1.2, ignore_eos=True)]
    for params in cases:
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        for p, o in zip(PROMPTS, outs):
            ids = tok(p)["input_ids"]
            c = o.outputs[0]
            ref = _hf_logprobs(bundled_model, ids + c.token_ids)  # teacher-forced: the model's own distribution
            total = 0.0
            for i, (t, pos) in enumerate(zip(c.token_ids, c.logprobs)):
                row = ref[len(ids) + i - 1]
                assert next(iter(pos)) == t and pos[t].logprob == pytest.approx(row[t].item(), abs=1e-4)
                assert pos[t].rank == int((row >= row[t]).sum())
                top = row.topk(5)
                assert set(top.indices.tolist()) <= set(pos) and len(pos) in (5, 6)  # the top 5 (+ the sampled)
                for tid, v in zip(top.indices.tolist(), top.values.tolist()):
                    assert pos[tid].logprob == pytest.approx(v, abs=1e-4)
                assert pos[t].decoded_token == tok.decode([t])
                total += pos[t].logprob
            assert c.cumulative_logprob == pytest.approx(total, abs=1e-6)


def test_prompt_logprobs_match_transformers_under_chunking_and_prefix_cache(bundled_model, llm, tok):
    prompt = PROMPTS[2]  # longer than the 16-token budget: several prefill chunks
    ids = tok(prompt)["input_ids"]
    ref = _hf_logprobs(bundled_model, ids)
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    first, again = llm.generate([prompt, prompt], params, use_tqdm=False)  # the second would hit the cache
    for out in (first, again):
        pl = out.prompt_logprobs
        assert len(pl) == len(ids) and pl[0] is None
        for i in range(1, len(ids)):
            row = ref[i - 1]
            assert next(iter(pl[i])) == ids[i]
            assert pl[i][ids[i]].logprob == pytest.approx(row[ids[i]].item(), abs=1e-4)
            top = row.topk(3)
            assert all(pl[i][t].logprob == pytest.approx(v, abs=1e-4)
                       for t, v in zip(top.indices.tolist(), top.values.tolist()))
    assert again.num_cached_tokens == 0  # prompt logprobs skip the prefix cache (vLLM's rule)

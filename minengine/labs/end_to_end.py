"""The end-to-end check of every lab: the real engine, running on the learner's part, gives the same greedy
tokens as transformers' ``generate`` on the same weights (the bundled tiny model, float32, CPU), on workloads
that make the part work: chunked prefill under a small token budget, repeated prefixes for prefix-cache hits, a
small KV pool that forces preemption and evicts cached blocks.

transformers' tokens are computed once per process and prompt (``reference_tokens``), so grading many
submissions in one process pays for them once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from minengine.labs.grading import LabFailure, learner_files, where_raised

# Public-domain Shakespeare: the prompts are cut from its tokens, so the tiny model sees text like its training data.
TEXT = """First Citizen:
Before we proceed any further, hear me speak.
All: Speak, speak.
First Citizen: You are all resolved rather to die than to famish?
ROMEO: But, soft! what light through yonder window breaks? It is the east, and Juliet is the sun.
Arise, fair sun, and kill the envious moon, Who is already sick and pale with grief,
That thou her maid art far more fair than she.
HAMLET: To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer
The slings and arrows of outrageous fortune, Or to take arms against a sea of troubles
And by opposing end them. To die: to sleep; No more; and by a sleep to say we end
The heart-ache and the thousand natural shocks That flesh is heir to.
"""


@dataclass(frozen=True)
class Workload:
    """Prompts run on one engine, each to ``max_tokens`` greedy tokens (EOS ignored).

    Attributes:
        name: how failures name it.
        settings: ``EngineConfig`` fields of the engine (the bundled model, float32, CPU otherwise).
        prompts: (start, length) cuts of the text's tokens, or tuples of cuts joined (``prompt_ids``); the same
            cut twice is a repeated prompt.
        max_tokens: tokens generated per prompt.
        passes: how often the prompts are sent again once the previous pass finished (a second pass hits the
            blocks the first one cached).
    """

    name: str
    settings: dict = field(default_factory=dict)
    prompts: tuple = ()
    max_tokens: int = 8
    passes: int = 1


# A 32-token prefix shared, prompts of whole blocks, and a prompt made of blocks the others hold at OTHER positions
# (only a hash chained on the blocks before it tells them apart).
_SHARED = ((0, 40), (0, 57), (0, 33), (0, 32), (0, 32), (10, 50), (0, 64), (100, 20),
           ((0, 16), (100, 32), (16, 32), (200, 2)))
WORKLOADS = {
    "prefix_hits": Workload("prefix_hits", dict(block_size=16, max_num_batched_tokens=48, num_kv_blocks=64),
                            _SHARED, passes=2),
    # one request at a time in 16 blocks: the second prompt reuses (evicts) blocks the first one cached, and the
    # third asks for the first one's prefix again: only its blocks not evicted may hit
    "evictions": Workload("evictions", dict(block_size=4, max_num_batched_tokens=32, num_kv_blocks=16, max_num_seqs=1),
                          ((0, 24), (60, 40), (0, 24), (100, 30), (0, 28), (60, 38)), max_tokens=6),
    "preemption": Workload("preemption", dict(block_size=4, max_num_batched_tokens=64, num_kv_blocks=22),
                           ((0, 30), (20, 27), (50, 33), (5, 25), (90, 18)), max_tokens=10),
    "chunked_prefill": Workload("chunked_prefill", dict(block_size=8, max_num_batched_tokens=16,
                                                        long_prefill_token_threshold=7, num_kv_blocks=64),
                                ((0, 45), (30, 9), (60, 1), (7, 70), (100, 16), (3, 2)), max_tokens=8),
}


@functools.cache
def text_tokens() -> tuple[int, ...]:
    """The token ids of ``TEXT`` under the bundled model's tokenizer."""
    from transformers import AutoTokenizer

    from minengine.config import BUNDLED_MODEL

    return tuple(AutoTokenizer.from_pretrained(BUNDLED_MODEL)(TEXT)["input_ids"])


def prompt_ids(cut: tuple) -> list[int]:
    """The tokens of a prompt: a (start, length) cut of the text's tokens, or a tuple of cuts joined."""
    if isinstance(cut[0], tuple):
        return [token for part in cut for token in prompt_ids(part)]
    start, length = cut
    return list(text_tokens()[start:start + length])


@functools.cache
def _hf_model():
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from minengine.config import BUNDLED_MODEL

    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # its "Loading weights" bar would run into the grader's report on one line
    try:
        return AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    finally:
        if was_on:
            logging.enable_progress_bar()


@functools.cache
def reference_tokens(prompt: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    """transformers' greedy continuation of ``prompt`` (EOS ignored), computed once per process."""
    import torch

    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        out = _hf_model().generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                   do_sample=False, eos_token_id=None, pad_token_id=0)
    return tuple(out[0, ids.shape[1]:].tolist())


def run_workload(labs: dict, workload: Workload):
    """Run ``workload`` on an engine built with ``labs``; return (engine, {request id: (prompt, tokens)}).

    Raises:
        LabFailure: the engine raised (which step, what), or it stopped making progress (a step cap).
    """
    from minengine import EngineConfig, LLMEngine, SamplingParams

    config = EngineConfig(labs=labs or None, max_model_len=256, seed=0, **workload.settings)
    engine = LLMEngine(config)
    params = SamplingParams(temperature=0, max_tokens=workload.max_tokens, ignore_eos=True)
    results, step = {}, 0
    for p in range(workload.passes):
        prompts = {f"pass{p}-req{i}": prompt_ids(cut) for i, cut in enumerate(workload.prompts)}
        for request_id, prompt in prompts.items():
            engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
        max_steps = step + sum(len(x) + workload.max_tokens for x in prompts.values()) * 3 + 20
        while engine.has_unfinished_requests():
            if step >= max_steps:
                raise LabFailure(f"workload {workload.name!r}: no progress: after {step} steps requests are still "
                                 f"unfinished (a step that schedules nothing, or a request that never finishes)")
            try:
                outputs = engine.step()
            except Exception as error:
                where = where_raised(error, learner_files(*(labs or {}).values()))
                raise LabFailure(f"workload {workload.name!r}: the engine raised {type(error).__name__}: {error} "
                                 f"at step {step} ({where})") from None
            step += 1
            for out in outputs:
                if out.finished:
                    results[out.request_id] = (prompts[out.request_id], list(out.outputs[0].token_ids))
    return engine, results


def engine_matches_transformers(labs: dict, workloads) -> None:
    """The real engine with ``labs`` (``EngineConfig.labs``) gives transformers' greedy tokens on every workload
    (names in ``WORKLOADS`` or ``Workload``s), and every KV block is free once the requests are done.

    Raises:
        LabFailure: naming the workload, the request, its prompt length and the first differing position.
    """
    for workload in workloads:
        workload = WORKLOADS[workload] if isinstance(workload, str) else workload
        engine, results = run_workload(labs, workload)
        expected_ids = {f"pass{p}-req{i}" for p in range(workload.passes) for i in range(len(workload.prompts))}
        if set(results) != expected_ids:
            raise LabFailure(f"workload {workload.name!r}: requests {sorted(expected_ids - set(results))} never "
                             "returned a finished output")
        for request_id, (prompt, got) in results.items():
            expected = list(reference_tokens(tuple(prompt), workload.max_tokens))
            if got != expected:
                at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
                raise LabFailure(
                    f"workload {workload.name!r}, request {request_id} (prompt of {len(prompt)} tokens): output token "
                    f"{at} differs from transformers: expected {expected[at:at + 4]}..., got {got[at:at + 4]}... "
                    f"(whole output: expected {expected}, got {got})")
        free, total = engine.kv_cache_manager.num_free_blocks, engine.num_kv_blocks
        if free != total:
            raise LabFailure(f"workload {workload.name!r}: every request finished but {total - free} of {total} KV "
                             f"blocks are still held (a leaked block: a reference never dropped)")


def end_to_end_check(lab: str, workloads: list[str | Workload]):
    """A ``Check.run`` for ``lab``: the engine with the learner's module as ``lab`` matches transformers on
    ``workloads`` (the module is passed by name: ``load_submission`` registered it in ``sys.modules``)."""
    def check(module) -> None:
        engine_matches_transformers({lab: module.__name__}, workloads)
    return check

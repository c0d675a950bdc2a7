"""Lab 7, speculative decoding by prompt lookup and its greedy verification: the spec (checks) and the install
(the engine's scheduler proposes with the learner's ``propose`` and commits with its ``commit_verified``; its
sampler verifies greedy proposals with its ``verify_step``).

The checks: ``propose`` on hand-made texts, ``accept`` and ``verify_step`` on hand-made rows whose names say the
rule, ``commit_verified`` on a real scheduler's request; then property checks: ``propose`` against the engine's
``NgramProposer`` on random texts, and the real scheduler driven with the learner's proposals over a token-free
target (a fixed rule for the next token, ``rule_target``), every request's output compared with plain
one-token-at-a-time decoding and the blocks checked after every step; then the real engine.
"""

from __future__ import annotations

import random
from types import ModuleType

from minengine.core.doors import make_scheduler
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.exceptions import VLLMValidationError
from minengine.labs.door import mix_into
from minengine.labs.end_to_end import Workload, end_to_end_check
from minengine.labs.grading import Check, LabFailure
from minengine.labs.registry import SKELETONS, LabSpec
from minengine.request import Request, RequestStatus
from minengine.sampling_params import SamplingParams
from minengine.worker.model_runner import ModelRunner

LAB = "spec_verify"

# ---- unit checks ---------------------------------------------------------------------------------------------
PROPOSE_CASES = [  # (the rule, tokens, k, n_min, n_max, the proposal)
    ("the longest matching suffix wins ([1, 2, 3] over [3])", [5, 3, 8, 1, 2, 3, 7, 7, 1, 2, 3], 3, 1, 3,
     [7, 7, 1]),
    ("the earliest occurrence of the suffix", [4, 6, 1, 4, 7, 2, 4], 2, 1, 1, [6, 1]),
    ("no earlier occurrence (the suffix itself does not count): nothing", [1, 2, 3, 4], 3, 1, 2, []),
    ("fewer than k when the text ends first", [1, 2, 1], 4, 1, 1, [2, 1]),
    ("no n-gram shorter than n_min", [9, 8, 9], 2, 2, 3, []),
]


def check_propose(module: ModuleType) -> None:
    for rule, tokens, k, n_min, n_max, expected in PROPOSE_CASES:
        got = module.propose(list(tokens), k, n_min, n_max)
        if list(got) != expected:
            raise LabFailure(f"propose, {rule}: tokens {tokens}, k={k}, n in [{n_min}, {n_max}]: expected {expected}, "
                             f"got {list(got)}")


ACCEPT_CASES = [  # (the rule, proposals, target rows, the tokens kept)
    ("every proposal accepted: all of them plus the bonus token of the last row", [5, 6, 7], [5, 6, 7, 8],
     [5, 6, 7, 8]),
    ("the first proposal rejected: only the correction", [5, 6, 7], [9, 6, 7, 8], [9]),
    ("a mismatch in the middle: the accepted prefix, the correction, nothing after it", [5, 6, 7], [5, 1, 2, 3],
     [5, 1]),
    ("a proposal that matches after a mismatch is NOT accepted", [5, 6, 7], [5, 1, 7, 8], [5, 1]),
    ("no proposals: the one token of a plain decode", [], [4], [4]),
]


def check_accept(module: ModuleType) -> None:
    for rule, proposals, target, expected in ACCEPT_CASES:
        got = module.accept(list(proposals), list(target))
        if got != expected:
            raise LabFailure(f"accept, {rule}: proposals {proposals}, target's rows {target}: expected {expected}, "
                             f"got {got}")


def check_verify_step(module: ModuleType) -> None:
    proposals = [[1, 2], [], [3], [4, 4, 4]]
    rows = [1, 2, 9, 6, 3, 5, 4, 7, 4, 4]
    expected = [[1, 2, 9], [6], [3, 5], [4, 7]]
    got = module.verify_step(list(rows), [list(p) for p in proposals])
    if got != expected:
        raise LabFailure(f"verify_step: request r owns len(proposals[r]) + 1 consecutive rows; proposals "
                         f"{proposals}, rows {rows}: expected {expected}, got {got}")


def _after_prefill(prompt_len: int, max_tokens: int, block_size: int = 4):
    """A scheduler and a request whose prompt is computed and first token sampled (token 100)."""
    kv = KVCacheManager(16, block_size, enable_prefix_caching=False)
    scheduler = make_scheduler(kv, 64, 4, 256)
    request = Request("r", list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0.0)
    scheduler.add_request(request)
    scheduler.update_from_output(scheduler.schedule(), {"r": [100]})
    return scheduler, request


COMMIT_CASES = [  # (what, prompt length, max_tokens, proposals, tokens kept)
    ("one of three proposals accepted (+ the correction)", 6, 10, 3, [101, 102]),
    ("all three accepted (+ the bonus)", 6, 10, 3, [101, 102, 103, 104]),
    ("max_tokens reached in the middle of the kept tokens", 6, 3, 3, [101, 102, 103, 104]),
]


def check_commit_verified(module: ModuleType) -> None:
    for what, prompt_len, max_tokens, k, kept in COMMIT_CASES:
        scheduler, request = _after_prefill(prompt_len, max_tokens)
        kv, before = scheduler.kv, request.num_computed_tokens
        kv.allocate_slots(request, 1 + k)  # the verifying step's slots: the latest token and k proposals
        status = module.commit_verified(scheduler, request, list(kept))
        label = (f"commit_verified ({what}): prompt {prompt_len} tokens, block_size {kv.block_size}, "
                 f"{before} computed, a step of 1 + {k} tokens keeping {kept}")
        if request.num_computed_tokens != before + len(kept):
            raise LabFailure(f"{label}: num_computed_tokens should be {before} + {len(kept)} = "
                             f"{before + len(kept)} (the latest token and the accepted proposals have K/V now), "
                             f"got {request.num_computed_tokens}")
        wanted = min(len(kept), max_tokens - 1)
        if request.output_token_ids != [100, *kept[:wanted]]:
            raise LabFailure(f"{label}: outputs should be {[100, *kept[:wanted]]} (append one at a time, stop at "
                             f"max_tokens={max_tokens}), got {request.output_token_ids}")
        expected_status = RequestStatus.FINISHED_LENGTH if wanted < len(kept) else None
        if status != expected_status:
            raise LabFailure(f"{label}: returned {status}, expected {expected_status}")
        held, needed = len(kv.req_to_blocks[request.request_id]), -(-request.num_computed_tokens // kv.block_size)
        if held != needed:
            raise LabFailure(f"{label}: the request holds {held} blocks, its {request.num_computed_tokens} computed "
                             f"tokens need {needed}: the blocks past them held only rejected proposals and must be "
                             f"freed (kv.truncate)")


# ---- property check: the real scheduler on a token-free target -------------------------------------------------
def rule_target(tokens: list[int]) -> int:
    """The token-free target's greedy next token after ``tokens``: a short cycle (so prompt lookup proposes
    and is often right) broken at every seventh position (so proposals are also rejected)."""
    last = tokens[-1]
    return (last * 7 + len(tokens)) % 13 if len(tokens) % 7 == 0 else (last + 1) % 5


def _plain_decode(prompt: list[int], max_tokens: int, stop: int | None) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(rule_target(tokens))
        if tokens[-1] == stop:
            break
    return tokens[len(prompt):]


def _target_rows(scheduled) -> list[int]:
    """The target's choice at each sampled row of a step (one row per request, or 1 + k while verifying)."""
    rows = []
    for s in scheduled:
        context = list(s.prompt_token_ids) + list(s.output_token_ids)[:s.output_index]
        context = context[:s.start_pos] + list(s.token_ids)
        first_row = len(context) - 1 - len(s.spec_token_ids)
        rows.extend(rule_target(context[:i + 1]) for i in range(first_row, len(context)))
    return rows


def run_speculative(module: ModuleType, prompts: list[list[int]], max_tokens: list[int], k: int, block_size: int,
                    num_blocks: int, budget: int, stop: int | None = None) -> None:
    """Drive a real scheduler with speculative decoding (k proposals) whose commits are the learner's, sampling
    with the learner's ``verify_step``; raises ``LabFailure`` on a leaked block, a wrong output or a stall."""
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=False)
    scheduler = make_scheduler(kv, budget, 8, 4096, speculative_config={
        "method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    scheduler.__class__ = _lab_scheduler_class(type(scheduler), module)
    scheduler.proposer = LabProposer(scheduler.speculative_config, module)
    stops = [] if stop is None else [stop]
    requests = [Request(f"r{i}", p, SamplingParams(max_tokens=m, ignore_eos=True, stop_token_ids=stops), 0.0)
                for i, (p, m) in enumerate(zip(prompts, max_tokens))]
    for r in requests:
        scheduler.add_request(r)
    for step in range(1, 2000):
        if not scheduler.has_unfinished_requests():
            break
        out = scheduler.schedule()
        sampling = [s for s in out.scheduled if s.sample]
        tokens = module.verify_step(_target_rows(sampling), [list(s.spec_token_ids) for s in sampling])
        scheduler.update_from_output(out, {s.request_id: t for s, t in zip(sampling, tokens)})
        _check_after_step(scheduler, [scheduler.requests.get(s.request_id) for s in sampling], step)
    else:
        raise LabFailure("the requests did not finish within 2000 steps")
    for r in requests:
        expected = _plain_decode(r.prompt_token_ids, r.sampling_params.max_tokens, stop)
        if r.output_token_ids != expected:
            first = next((i for i, (a, b) in enumerate(zip(r.output_token_ids, expected)) if a != b),
                         min(len(expected), len(r.output_token_ids)))
            raise LabFailure(f"request {r.request_id} (prompt {r.prompt_token_ids}, k={k}): its output differs from "
                             f"one-token-at-a-time decoding at position {first}: expected {expected}, got "
                             f"{r.output_token_ids}")
    if kv.num_free_blocks != num_blocks:
        raise LabFailure(f"every request finished but {num_blocks - kv.num_free_blocks} blocks are still held")


def _check_after_step(scheduler, sampled: list[Request | None], step: int) -> None:
    """Every request that sampled and runs on: all its tokens but the newest computed, and exactly the blocks
    those need."""
    block_size = scheduler.kv.block_size
    for r in sampled:
        if r is None:  # finished in this step
            continue
        if r.num_computed_tokens != r.num_tokens - 1:
            raise LabFailure(f"after step {step}, request {r.request_id} has {r.num_tokens} tokens and "
                             f"{r.num_computed_tokens} computed: after a sampled step all but the newest token "
                             f"have K/V (num_computed_tokens grows by the number of tokens kept)")
        held, needed = len(scheduler.kv.req_to_blocks.get(r.request_id, ())), -(-r.num_computed_tokens // block_size)
        if held != needed:
            raise LabFailure(f"after step {step}, request {r.request_id} holds {held} blocks while its "
                             f"{r.num_computed_tokens} computed tokens need {needed} (block_size {block_size}): "
                             f"blocks of rejected proposals were not freed")


def check_propose_like_the_engine(module: ModuleType) -> None:
    """Random texts (small alphabets: many repeats), k and n ranges: the engine's ``NgramProposer``'s proposal."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from minengine.core.spec_decode import NgramProposer, SpeculativeConfig

    @settings(max_examples=60, derandomize=True, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 10**6), length=st.integers(1, 30), k=st.integers(1, 5),
           n=st.tuples(st.integers(1, 3), st.integers(0, 2)))
    def random_text(seed, length, k, n):
        rng = random.Random(seed)
        tokens = [rng.randint(0, 3) for _ in range(length)]
        config = SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_min=n[0], prompt_lookup_max=n[0] + n[1])
        expected = NgramProposer(config).propose(Request("r", list(tokens), SamplingParams(), 0.0))
        got = list(module.propose(list(tokens), k, n[0], n[0] + n[1]))
        if got != expected:
            raise LabFailure(f"propose(tokens={tokens}, k={k}, n_min={n[0]}, n_max={n[0] + n[1]}): the engine's "
                             f"prompt lookup proposes {expected}, yours {got}")

    random_text()


def check_speculative_runs(module: ModuleType) -> None:
    """Random prompts, proposal counts, block sizes and budgets; every output is the plain decoding's."""
    from hypothesis import HealthCheck, Phase, example, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=20, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate),
              suppress_health_check=list(HealthCheck))
    @given(prompts=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=12), min_size=1, max_size=4),
           max_tokens=st.lists(st.integers(1, 24), min_size=4, max_size=4), k=st.integers(1, 5),
           block_size=st.sampled_from([1, 2, 4, 8]), budget=st.sampled_from([8, 64]),
           stop=st.sampled_from([None, 2, 3]))
    @example(prompts=[[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]], max_tokens=[9, 9, 9, 9], k=4, block_size=4, budget=64,
             stop=3)  # a proposal accepted in the middle of the kept tokens is a stop token
    def random_run(prompts, max_tokens, k, block_size, budget, stop):
        run_speculative(module, prompts, max_tokens[:len(prompts)], k, block_size, 256, budget, stop)

    random_run()


# ---- the engine on the learner's verification ------------------------------------------------------------------
class LabProposer:
    """The scheduler's proposer (``NgramProposer``'s interface) on the learner's ``propose``."""

    def __init__(self, config, module: ModuleType):
        self.config, self.k, self.lab_module = config, config.num_speculative_tokens, module

    def propose(self, request: Request, max_tokens: int | None = None) -> list[int]:
        """Up to ``min(k, max_tokens)`` proposals for ``request``. Raises ``LabFailure`` when the learner's
        ``propose`` returns more than it was asked for (the step has room for no more)."""
        k = self.k if max_tokens is None else min(self.k, max_tokens)
        if k <= 0:
            return []
        proposal = list(self.lab_module.propose(request.token_ids_slice(0, request.num_tokens), k,
                                                self.config.prompt_lookup_min, self.config.prompt_lookup_max))
        if len(proposal) > k:
            raise LabFailure(f"propose returned {len(proposal)} tokens for request {request.request_id}, more than "
                             f"k={k}")
        return proposal


class LabSpeculativeCommit:
    """Scheduler mixin: a decode that verified proposals is committed by the learner's ``commit_verified``."""

    lab_module: ModuleType

    def commit_sampled(self, request, s, tokens):
        if not s.spec_token_ids:
            return super().commit_sampled(request, s, tokens)
        return self.lab_module.commit_verified(self, request, list(tokens))


def _lab_scheduler_class(scheduler_class: type, module: ModuleType) -> type:
    return type(f"Lab{scheduler_class.__name__}", (LabSpeculativeCommit, scheduler_class), {"lab_module": module})


def _plain_greedy(s) -> bool:
    """Rows the learner's greedy verification may take: an argmax with no masks, penalties or logprobs."""
    params = s.sampling_params
    return (s.structured_output is None and params.logprobs is None
            and not any(params.needs_processing(s.output_index + i) for i in range(1 + len(s.spec_token_ids))))


class LabVerifyingSampler:
    """``Sampler`` mixin: steps with proposals, when every row is a plain greedy one, are verified by the
    learner's ``verify_step`` on the rows' argmax; any other step is the engine's own sampling."""

    lab_module: ModuleType

    def __call__(self, logits, requests):
        if (self.logits_processors is not None or not any(s.spec_token_ids for s in requests)
                or not all(map(_plain_greedy, requests))):
            return super().__call__(logits, requests)
        self.last_logprobs = {}
        return self.lab_module.verify_step(logits.float().argmax(-1).tolist(),
                                           [list(s.spec_token_ids) for s in requests])


def install(engine, module: ModuleType) -> None:
    """``engine`` proposes with ``module.propose``, verifies greedy proposals with ``module.verify_step`` and
    commits them with ``module.commit_verified``.

    Raises:
        VLLMValidationError: naming ``labs``: the engine has no speculative decoding (``speculative_config``),
            or its model is not in this process.
    """
    if not hasattr(engine.scheduler, "proposer"):
        raise VLLMValidationError("the spec_verify lab needs speculative decoding: speculative_config="
                                  "{'method': 'ngram', 'num_speculative_tokens': k}", parameter="labs")
    if not isinstance(engine.runner, ModelRunner):
        raise VLLMValidationError("the spec_verify lab runs the model in this process (tensor_parallel_size=1)",
                                  parameter="labs")
    mix_into(engine.scheduler, type("LabSpeculativeCommit", (LabSpeculativeCommit,), {"lab_module": module}))
    engine.scheduler.proposer = LabProposer(engine.scheduler.speculative_config, module)
    mix_into(engine.runner.sampler, type("LabVerifyingSampler", (LabVerifyingSampler,), {"lab_module": module}))


# Prompt lookup on repeated text: the proposals are often right (accepted runs, bonus tokens) and often wrong.
SPECULATIVE = Workload("speculative", dict(block_size=4, max_num_batched_tokens=64, num_kv_blocks=96,
                                           speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                               "prompt_lookup_max": 3, "prompt_lookup_min": 1}),
                       ((0, 40), (60, 30), (100, 45), (7, 12)), max_tokens=24)

SPEC = LabSpec(
    name=LAB, title="Speculative decoding: prompt lookup and verification", order=7, minutes=60,
    teaches="why speculative decoding is exact: propose from the text's own earlier occurrences, keep the longest "
            "prefix of the proposals the target agrees with plus its own next token, give back the rest's blocks",
    part="speculative decoding's proposer and verification (core/spec_decode.py's NgramProposer, "
         "worker/spec_verify.py, core/spec_scheduling.py's commit)",
    skeleton=SKELETONS / LAB / f"{LAB}.py", solution=f"minengine.labs.solutions.{LAB}",
    checks=[
        Check("propose: the earliest earlier occurrence of the longest matching suffix, then up to k tokens",
              "unit", check_propose),
        Check("accept: the accepted prefix, then the correction or the bonus token", "unit", check_accept),
        Check("verify_step: each request's own len(proposals) + 1 rows", "unit", check_verify_step),
        Check("commit_verified: progress, blocks of rejected proposals freed, stop in the middle", "unit",
              check_commit_verified),
        Check("propose on random texts: the engine's prompt lookup", "property", check_propose_like_the_engine),
        Check("random speculative runs of the real scheduler: plain decoding's outputs, no leaked block", "property",
              check_speculative_runs),
        Check("the engine on your verification matches transformers: prompt-lookup speculation", "end_to_end",
              end_to_end_check(LAB, [SPECULATIVE])),
    ],
    install=install,
)

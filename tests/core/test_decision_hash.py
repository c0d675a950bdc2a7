"""Every scheduling decision over many random model-free runs, hashed: a refactoring of ``core/`` that must not
change behaviour (making per-step work proportional to what changed, say) must leave the hash as it is.

Each run is a random engine and workload from the soak test (``tests/properties/test_soak.py``: every policy, recompute
and swap, prefix caching, chunking, speculative decoding, predictors, tiny pools), driven straight through
``Scheduler.schedule`` / ``update_from_output`` / ``rollback`` / ``finish_requests`` with random aborts,
deadlines and failing steps. The "model" is a pure function of (request id, token index), repetitive in half
the runs so that proposals are accepted as well as rejected. What is hashed, step by step: every field of the
``SchedulerOutput`` (each ``ScheduledRequest``'s id, tokens, position, whole block table, sample and prefill
flags, output index, proposals; preemptions, admissions, prefix counters, swap pairs), the requests that got
tokens and that finished (with their status), and at the end the scheduler's counters and the free blocks.

``DECISION_HASH`` changes only with an intended change of scheduling behaviour: update it then (run this file
as a script to print the hash) and say so in the commit message.

    python tests/core/test_decision_hash.py          # the hash of DEFAULT_RUNS runs
    python tests/core/test_decision_hash.py 300      # of 300 runs
"""

from __future__ import annotations

import hashlib
import random
import sys
import zlib
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from minengine.request import RequestStatus  # noqa: E402
from tests.fake_engine import FakeEngine  # noqa: E402
from tests.properties.test_soak import random_engine_settings, random_requests  # noqa: E402

DEFAULT_RUNS = 1500  # ~7 s of CPU
# Set when the balanced policy gained its rotating decode share; making per-step work proportional to what changed
# kept it.
DECISION_HASH = "c12e022d991e62aff7c0cd90f7d716088f2f499b7e6f6702a3c5553c0bfa0c58"


ENDINGS = (("abort", RequestStatus.FINISHED_ABORTED), ("deadline", RequestStatus.FINISHED_TIMEOUT))


def model_token(request_id: str, index: int, cyclic: bool) -> int:
    """The fake model's token ``index`` of a request: stable across processes (no ``hash()``)."""
    h = zlib.crc32(f"{request_id}:{index}".encode())
    return 3 + (zlib.crc32(request_id.encode()) + index) % 5 if cyclic else 3 + h % 997


def step_record(out, got_token, finished) -> bytes:
    scheduled = [(s.request_id, list(s.token_ids), s.start_pos, list(s.block_ids), s.sample, s.is_prefill,
                  s.output_index, list(s.spec_token_ids)) for s in out.scheduled]
    return repr((scheduled, out.preempted_ids, out.admitted_ids, out.prefix_queried_tokens, out.prefix_hit_tokens,
                 out.readmission_hit_tokens, out.blocks_to_swap_out, out.blocks_to_swap_in, out.num_spec_tokens,
                 [r.request_id for r in got_token], [(r.request_id, r.status.value) for r in finished])).encode()


def run_one(seed: int, digest) -> None:
    """One random engine and workload; every decision goes into ``digest``."""
    rng = random.Random(seed)
    cfg = random_engine_settings(rng)
    cyclic = rng.random() < 0.5
    capacity = cfg["num_blocks"] * cfg["block_size"]
    reqs = random_requests(rng, capacity, cfg["max_model_len"])
    if rng.random() < 0.2:  # a crowd: more requests and sequence slots than the soak's
        cfg["max_num_seqs"] = rng.randint(8, 32)
        for k in range(1, 4):
            reqs += [{**r, "rid": f"{r['rid']}.{k}"} for r in random_requests(rng, capacity, cfg["max_model_len"])]
    eng = FakeEngine(**cfg)  # only for its scheduler and ``add`` (the engine's admission check)
    sched = eng.sched
    fail_rate = rng.choice([0.0, 0.0, 0.05, 0.2])
    pending = sorted(reqs, key=lambda r: r["arrive"])
    step = failures = 0
    while pending or sched.has_unfinished_requests():
        while pending and pending[0]["arrive"] <= step:
            r = pending.pop(0)
            eng.add(r["rid"], r["prompt"], r["max_tokens"], eos=r["eos"], priority=r["priority"])
        for r in reqs:
            for key, status in ENDINGS:
                if r[key] is not None and r[key] + r["arrive"] == step:
                    done = sched.finish_requests([r["rid"]], status)
                    digest.update(repr([(d.request_id, d.status.value) for d in done]).encode())
        if not sched.has_unfinished_requests():
            step += 1
            continue
        out = sched.schedule()
        if rng.random() < fail_rate and failures < 20:
            failures += 1
            digest.update(b"rollback" + step_record(out, [], []))
            sched.rollback(out)
            continue
        sampled = {}
        for s in out.scheduled:
            if not s.sample:
                continue
            tokens = []
            for i in range(len(s.spec_token_ids) + 1):  # the sampler's verification
                tokens.append(model_token(s.request_id, s.output_index + i, cyclic))
                if i == len(s.spec_token_ids) or tokens[-1] != s.spec_token_ids[i]:
                    break
            sampled[s.request_id] = tokens
        got_token, finished = sched.update_from_output(out, sampled)
        digest.update(step_record(out, got_token, finished))
        step += 1
        assert step < 50_000, f"seed {seed}: no end"
    digest.update(repr((sched.num_steps, sched.num_preemptions, sched.num_swapped_out_blocks,
                        sched.num_swapped_in_blocks, sched.kv.num_free_blocks)).encode())


def decision_hash(num_runs: int) -> str:
    digest = hashlib.sha256()
    for seed in range(num_runs):
        run_one(seed, digest)
    return digest.hexdigest()


def test_scheduling_decisions_unchanged():
    """The decisions of ``DEFAULT_RUNS`` random runs hash to ``DECISION_HASH`` (see the module docstring)."""
    assert decision_hash(DEFAULT_RUNS) == DECISION_HASH


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_RUNS
    print(n, decision_hash(n))

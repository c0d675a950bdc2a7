"""Predictive scheduling: output-length predictors, shortest-predicted-first with aging, and
predicted-length-aware admission (``reserve_predicted_kv``).

The predictors are checked against their definitions (the oracle is the truth, the noisy oracle's log error
has standard deviation sigma, the learned one predicts its bucket's median and beats a constant on held-out
Azure requests); the policy on the model-free ``FakeEngine`` (shortest first, bounded wait with aging, a
starving stream without it); admission by the cost it claims to cut (preemptions) and by its cost when the
prediction is wrong.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from minengine import EngineConfig
from minengine.core.policies import PolicySettings
from minengine.core.predictors import (
    LearnedPredictor,
    NoisyOraclePredictor,
    OraclePredictor,
    OutputLengthPredictor,
    evaluate,
    kendall_tau_b,
    prediction_error,
    spearman,
)
from minengine.request import Request
from minengine.sampling_params import SamplingParams
from minengine.workloads import find_data_dir, load_azure_trace
from minengine.workloads.traces import azure_conv_path
from tests.fake_engine import FakeEngine


def request(rid: str, prompt_len: int = 8, max_tokens: int = 16) -> Request:
    return Request(rid, [3] * prompt_len, SamplingParams(max_tokens=max_tokens), 0.0)


# ---- the predictors ----------------------------------------------------------------------------------------
def test_oracle_is_the_true_length():
    assert OraclePredictor().predict(request("a", max_tokens=37)) == 37  # max_tokens (ignore_eos replays)
    lengths = {"a": 5, "b": 500}
    assert OraclePredictor(lengths).predict(request("a", max_tokens=37)) == 5
    assert OraclePredictor(lengths).predict(request("b", max_tokens=37)) == 37  # never beyond max_tokens
    with pytest.raises(ValueError, match="no true output length"):
        OraclePredictor(lengths).predict(request("c"))


def test_noisy_oracle_log_error_has_standard_deviation_sigma():
    assert all(NoisyOraclePredictor(0.0).predict(request(f"r{i}", max_tokens=40 + i)) == 40 + i for i in range(50))
    for sigma in (0.25, 1.0):
        p = NoisyOraclePredictor(sigma, seed=3)
        logs = [math.log(p.predict(request(f"r{i}", max_tokens=1000)) / 1000) for i in range(3000)]
        assert statistics.pstdev(logs) == pytest.approx(sigma, rel=0.08)
        assert abs(statistics.median(logs)) < 0.08 * sigma + 0.01  # median-unbiased
    p = NoisyOraclePredictor(0.5, seed=1)
    assert p.predict(request("x", max_tokens=100)) == p.predict(request("x", max_tokens=100))  # per request id
    for bad in (-0.1, math.inf, "1", True):
        with pytest.raises(ValueError, match="sigma"):
            NoisyOraclePredictor(bad)


def test_learned_predicts_the_bucket_median():
    g = random.Random(0)
    prompts = [g.randrange(1, 1000) for _ in range(4000)]
    outputs = [(50 if p < 500 else 400) + g.randrange(-20, 21) for p in prompts]
    p = LearnedPredictor(num_buckets=8).fit(prompts, outputs)
    assert abs(p.predict_length(100) - 50) <= 5 and abs(p.predict_length(900) - 400) <= 5
    assert p.predict(request("a", prompt_len=900)) == p.predict_length(900)
    err = evaluate(p, prompts[:500], outputs[:500])
    assert err.spearman > 0.7 and err.within_2x > 0.95
    with pytest.raises(RuntimeError, match="before fit"):
        LearnedPredictor().predict_length(3)
    for kwargs, field in (({"num_buckets": 0}, "num_buckets"), ({"quantile": 1.5}, "quantile")):
        with pytest.raises(ValueError, match=field):
            LearnedPredictor(**kwargs)
    with pytest.raises(ValueError, match="prompt lengths"):
        evaluate(OraclePredictor(), [1], [1])


def test_learned_on_azure_beats_a_constant_on_held_out_requests():
    """Fit on the first half of the Azure conversation trace, evaluate on the second half: lower error than
    predicting the training median for everyone, and a positive rank correlation (what ordering needs)."""
    path = azure_conv_path(find_data_dir(None))
    if path is None:
        pytest.skip("shared/data (Azure trace) absent")
    trace = load_azure_trace(path)
    train, test = trace[:len(trace) // 2], trace[len(trace) // 2:]
    p = LearnedPredictor().fit([r.prompt_len for r in train], [r.output_len for r in train])
    true = [r.output_len for r in test]
    learned = evaluate(p, [r.prompt_len for r in test], true)
    constant = prediction_error([round(statistics.median(r.output_len for r in train))] * len(test), true)
    assert learned.mae < 0.7 * constant.mae and learned.median_relative_error < constant.median_relative_error
    assert learned.spearman > 0.5 and learned.kendall_tau > 0.3


def test_rank_correlations():
    x = [1, 2, 3, 4, 5]
    assert spearman(x, [10, 20, 30, 40, 50]) == pytest.approx(1) and kendall_tau_b(x, x[::-1]) == pytest.approx(-1)
    assert math.isnan(spearman(x, [1] * 5))
    e = prediction_error([10, 30], [10, 20])
    assert e.mae == 5 and e.within_2x == 1 and e.median_relative_error == pytest.approx(0.25)
    with pytest.raises(ValueError):
        prediction_error([1], [1, 2])


def test_bad_predictive_settings_name_the_field():
    with pytest.raises(ValueError, match="predicted_length_aging_steps"):
        EngineConfig(predicted_length_aging_steps=-1)
    with pytest.raises(ValueError, match="reserve_predicted_kv"):
        EngineConfig(reserve_predicted_kv="yes")
    with pytest.raises(ValueError, match="output_length_predictor"):
        EngineConfig(output_length_predictor="oracle")
    assert EngineConfig(scheduling_policy="shortest-predicted-first").scheduling_policy == "shortest-predicted-first"


# ---- shortest-predicted-first --------------------------------------------------------------------------------
def finish_order(policy: str, predictor: OutputLengthPredictor | None = None) -> tuple[list[str], float]:
    """Eight requests queued at once, one sequence slot: the finish order and the mean finish step."""
    eng = FakeEngine(num_blocks=256, block_size=4, budget=64, max_num_seqs=1, policy=policy, predictor=predictor,
                     settings=PolicySettings(predicted_length_aging_steps=0))
    lengths = [30, 5, 22, 1, 14, 9, 3, 40]
    for i, n in enumerate(lengths):
        eng.add(f"r{i}", [i + 3] * 8, max_tokens=n)
    finished_at = {}
    while eng.sched.has_unfinished_requests():
        eng.step()
        for r in eng.finished:
            finished_at.setdefault(r.request_id, eng.steps)
    return [r.request_id for r in eng.finished], statistics.fmean(finished_at.values())


def test_shortest_predicted_first_runs_short_requests_first():
    order, mean_spf = finish_order("shortest-predicted-first")  # the oracle: max_tokens
    assert order == ["r3", "r6", "r1", "r5", "r4", "r2", "r0", "r7"]
    fcfs, mean_fcfs = finish_order("decode-first")
    assert fcfs == [f"r{i}" for i in range(8)]
    assert mean_spf < 0.7 * mean_fcfs  # shortest-job-first minimises the mean completion time
    # a predictor that gets the order backwards gives the longest first
    backwards = _Table({f"r{i}": 100 - n for i, n in enumerate([30, 5, 22, 1, 14, 9, 3, 40])})
    order, _ = finish_order("shortest-predicted-first", backwards)
    assert order == ["r7", "r0", "r2", "r4", "r5", "r1", "r6", "r3"]


def starvation_run(aging: int) -> tuple[FakeEngine, dict[str, int]]:
    """A long request (20 tokens) waits while a stream of one-token requests arrives, one every step, for 120
    steps, with one sequence slot: the step each request is admitted in, and the request's arrival steps."""
    eng = FakeEngine(num_blocks=256, block_size=4, budget=64, max_num_seqs=1, policy="shortest-predicted-first",
                     settings=PolicySettings(predicted_length_aging_steps=aging))
    eng.add("short-0", [3] * 8, max_tokens=1)
    eng.add("long", [4] * 8, max_tokens=20)
    admitted = {}
    for step in range(1, 120):
        eng.add(f"short-{step}", [step % 40 + 5] * 8, max_tokens=1)
        out = eng.step()
        admitted.update(dict.fromkeys(out.admitted_ids, eng.steps))
    eng.run()
    assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks and not eng.sched.has_unfinished_requests()
    return eng, admitted


def test_aging_bounds_the_wait_of_a_long_request():
    """Without aging the long request waits for the whole stream. With aging every ``aging`` steps forgive it
    one token of predicted work, so once it has waited aging x 20 steps its score is <= 0, below any newcomer's
    (>= 1): no request arriving later than that is admitted before it (the bound of the policy's docstring)."""
    _, starved = starvation_run(aging=0)
    assert "long" not in starved  # never admitted while the stream lasts
    aging = 2
    eng, admitted = starvation_run(aging)
    arrival = {rid: r.arrival_step for rid, r in ((r.request_id, r) for r in eng.finished)}
    long_at = admitted["long"]
    assert long_at <= 1 + aging * 20 + 2, long_at
    late = [rid for rid, at in admitted.items() if at < long_at and arrival[rid] > arrival["long"] + aging * 20]
    assert not late, late


# ---- predicted-length-aware admission ------------------------------------------------------------------------
def admission_run(reserve: bool, predictor: OutputLengthPredictor | None = None) -> FakeEngine:
    """Sixteen requests with short prompts and long outputs into a pool that holds about four of them at their
    end: admitted all at once they outgrow the pool and preempt each other."""
    eng = FakeEngine(num_blocks=40, block_size=4, budget=64, max_num_seqs=16, predictor=predictor,
                     reserve_predicted_kv=reserve)
    for i in range(16):
        eng.add(f"r{i}", [i + 3] * 4, max_tokens=32 + (i % 4) * 4)
    eng.run()
    assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks  # every block free again
    assert len(eng.finished) == 16 and all(r.num_output_tokens == r.sampling_params.max_tokens for r in eng.finished)
    return eng


def preemptions(eng: FakeEngine) -> int:
    return sum(len(out.preempted_ids) for out in eng.outputs)


def test_reserving_predicted_kv_avoids_preemptions():
    plain, reserved = admission_run(False), admission_run(True)  # the oracle by default: max_tokens
    assert preemptions(plain) > 0
    assert preemptions(reserved) == 0


def test_reserving_by_a_wrong_prediction_preempts_again():
    """The cost when the prediction is wrong: predicted far too short, requests are admitted as if they were
    short, outgrow their reservations and get preempted; a prediction too long over-reserves (no preemption,
    but fewer requests run at once, so the run takes more steps)."""
    too_short = admission_run(True, OraclePredictor({f"r{i}": 1 for i in range(16)}))
    right = admission_run(True)
    too_long = admission_run(True, _Scaled(4.0))
    assert preemptions(too_short) > 0
    assert preemptions(too_long) == 0 and too_long.steps > right.steps


class _Scaled(OutputLengthPredictor):
    """max_tokens times a factor (a predictor biased long)."""

    def __init__(self, factor: float):
        self.factor = factor

    def predict(self, request) -> int:
        return round(request.sampling_params.max_tokens * self.factor)


class _Table(OutputLengthPredictor):
    """Predictions from a table, not capped at max_tokens (a predictor can be wrong either way)."""

    def __init__(self, table: dict[str, int]):
        self.table = table

    def predict(self, request) -> int:
        return self.table[request.request_id]

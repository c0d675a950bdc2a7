"""Output-length predictors for predictive scheduling: how many tokens will a request generate?

A scheduler that knew each request's output length could run the shortest first (shortest-job-first minimises
mean latency; with a long job in front every short one waits for it: head-of-line blocking) and give each
request exactly the KV memory it will need (no preemption, no over-reservation). It does not know; it can
predict. Three predictors behind one interface:

- ``OraclePredictor``: the true length (an upper bound on what prediction can give; in a trace replay the true
  length is known, and ``max_tokens`` with ``ignore_eos`` IS the true length);
- ``NoisyOraclePredictor``: the true length times a log-normal error ``exp(sigma * z)``, z ~ N(0, 1): the
  knob for "how good must a predictor be?" (median-unbiased; sigma 0.5 is within x1.65 two times in three);
- ``LearnedPredictor``: the median output length of similar prompts, fitted on one part of a trace (prompt
  length buckets) and evaluated on another (``evaluate``: MAE, median relative error, rank correlations).

Literature: S3 (Jin et al., "S3: Increasing GPU Utilization during Generative Inference for Higher Throughput",
NeurIPS 2023) predicts the output length to allocate KV memory for it and re-allocates on a misprediction;
Fu et al., "Efficient LLM Scheduling by Learning to Rank" (NeurIPS 2024) learn to RANK requests by output
length (Kendall's tau is their measure) and schedule shortest-predicted-first with starvation prevention;
Zheng et al., "Response Length Perception and Sequence Scheduling" (NeurIPS 2023) ask the LLM itself.

The Azure conversation trace (Patel et al., Splitwise, ISCA 2024) has no prompt text, only lengths, so the
learned predictor here sees the prompt length alone; the papers' predictors read the prompt (a small language
model), which a trace without text cannot reproduce.

No torch here (``core/`` never imports it).
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class OutputLengthPredictor:
    """Predicts a request's total output length in tokens (>= 1) when it is added to the scheduler.

    Subclasses implement ``predict``. The scheduler stores the prediction in ``Request.predicted_output_len``;
    the policy ``shortest-predicted-first`` orders by what is left of it, and ``reserve_predicted_kv`` admits
    by the KV it needs.
    """

    name: str = ""

    def predict(self, request) -> int:
        """Predicted output tokens of ``request`` (a ``Request``: ``prompt_token_ids``, ``sampling_params``,
        ``request_id``), an integer >= 1."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _true_length(request, lengths: Mapping[str, int] | None) -> int:
    if lengths is None:
        return request.sampling_params.max_tokens
    if request.request_id not in lengths:
        raise ValueError(f"oracle: no true output length for request {request.request_id!r}")
    return lengths[request.request_id]


class OraclePredictor(OutputLengthPredictor):
    """The true output length: from ``lengths`` (request id -> tokens), or without it the request's
    ``max_tokens`` (exact when requests run to ``max_tokens``: trace replays with ``ignore_eos``; an upper bound
    otherwise). Never longer than ``max_tokens``.

    Raises (from ``predict``):
        ValueError: ``lengths`` has no entry for the request.
    """

    name = "oracle"

    def __init__(self, lengths: Mapping[str, int] | None = None):
        self.lengths = lengths

    def predict(self, request) -> int:
        return max(1, min(_true_length(request, self.lengths), request.sampling_params.max_tokens))


class NoisyOraclePredictor(OutputLengthPredictor):
    """The true length (as ``OraclePredictor``) times ``exp(sigma * z)``, z ~ N(0, 1), rounded, at least 1.

    The error is multiplicative and log-normal, so ``sigma`` is the standard deviation of
    ``log(predicted / true)``: 0 is the oracle, 0.5 is off by more than x1.65 a third of the time, 1.0 by more
    than x2.7. z is a pure function of (``seed``, request id), so a request gets the same prediction in every
    run and whatever the order of arrivals. Predictions are not capped at ``max_tokens`` (a noisy predictor may
    over-predict; the scheduler only uses them to order and reserve).

    Raises:
        ValueError: ``sigma`` not a finite number >= 0.
    """

    def __init__(self, sigma: float, seed: int = 0, lengths: Mapping[str, int] | None = None):
        if not isinstance(sigma, (int, float)) or isinstance(sigma, bool) or not 0 <= sigma < math.inf:
            raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r}")
        self.sigma, self.seed, self.lengths = float(sigma), seed, lengths
        self.name = f"noisy oracle (sigma {sigma:g})"

    def log_error(self, request_id: str) -> float:
        """``sigma * z`` of this request: log(predicted / true) before rounding."""
        return self.sigma * random.Random(f"{self.seed}:{request_id}").gauss(0.0, 1.0)

    def predict(self, request) -> int:
        true = _true_length(request, self.lengths)
        return max(1, round(true * math.exp(self.log_error(request.request_id))))


class LearnedPredictor(OutputLengthPredictor):
    """Output length by prompt length: the ``quantile`` of the output lengths of the training requests whose
    prompt length falls in the same bucket (buckets with equal numbers of training requests).

    A non-parametric regression, chosen because output length is far from linear in prompt length on real
    traces (on the Azure conversation trace the median output is ~90 tokens for most prompt lengths and ~400
    for prompts of ~700-1,500 tokens). Fit with ``fit``; predictions use the bucket of the prompt's length.

    Args:
        num_buckets: prompt-length buckets (fewer when there are not enough distinct lengths).
        quantile: which quantile of a bucket's outputs to predict (0.5 = median, what minimises the mean
            absolute error).

    Raises:
        ValueError: ``num_buckets`` < 1, ``quantile`` outside [0, 1].
    """

    def __init__(self, num_buckets: int = 32, quantile: float = 0.5):
        if not isinstance(num_buckets, int) or isinstance(num_buckets, bool) or num_buckets < 1:
            raise ValueError(f"num_buckets must be a positive integer, got {num_buckets!r}")
        if not isinstance(quantile, (int, float)) or not 0 <= quantile <= 1:
            raise ValueError(f"quantile must be in [0, 1], got {quantile!r}")
        self.num_buckets, self.quantile = num_buckets, float(quantile)
        self.edges: list[int] = []  # upper prompt-length bound of each bucket but the last (sorted)
        self.values: list[int] = []  # the predicted output length of each bucket
        self.name = "learned (prompt-length buckets)"

    def fit(self, prompt_lens: Sequence[int], output_lens: Sequence[int]) -> LearnedPredictor:
        """Fit on training pairs (tokens). Returns self.

        Raises:
            ValueError: empty or mismatched inputs, or lengths < 1.
        """
        if len(prompt_lens) != len(output_lens) or not prompt_lens:
            raise ValueError("fit needs as many prompt lengths as output lengths, at least one")
        if min(prompt_lens) < 1 or min(output_lens) < 1:
            raise ValueError("prompt and output lengths must be >= 1 token")
        pairs = sorted(zip(prompt_lens, output_lens))
        n = len(pairs)
        edges, values, start = [], [], 0
        for b in range(1, self.num_buckets + 1):
            end = round(b * n / self.num_buckets)
            while end < n and end > start and pairs[end][0] == pairs[end - 1][0]:
                end += 1  # one prompt length never spans two buckets
            if end <= start:
                continue
            outs = sorted(o for _, o in pairs[start:end])
            values.append(max(1, round(_quantile(outs, self.quantile))))
            edges.append(pairs[end - 1][0])
            start = end
            if start >= n:
                break
        self.edges, self.values = edges[:-1], values
        return self

    def predict_length(self, prompt_len: int) -> int:
        """The prediction for a prompt of ``prompt_len`` tokens. Raises ``RuntimeError`` before ``fit``."""
        if not self.values:
            raise RuntimeError("LearnedPredictor.predict before fit")
        return self.values[bisect.bisect_left(self.edges, prompt_len)]

    def predict(self, request) -> int:
        return self.predict_length(len(request.prompt_token_ids))


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    k = (len(sorted_values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's r of the ranks, ties averaged); NaN when either is constant."""
    rx, ry = _ranks(x), _ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else math.nan


def kendall_tau_b(x: Sequence[float], y: Sequence[float], max_pairs_n: int = 4000, seed: int = 0) -> float:
    """Kendall's tau-b (ties in either variable corrected; the measure Fu et al. 2024 report). O(n^2): above
    ``max_pairs_n`` values it is computed on a seeded random sample of that many. NaN when undefined."""
    n = len(x)
    if n != len(y):
        raise ValueError("x and y must have the same length")
    idx = list(range(n))
    if n > max_pairs_n:
        idx = random.Random(seed).sample(idx, max_pairs_n)
    xs, ys = [x[i] for i in idx], [y[i] for i in idx]
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(xs)):
        xi, yi = xs[i], ys[i]
        for j in range(i + 1, len(xs)):
            dx, dy = xs[j] - xi, ys[j] - yi
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denom if denom else math.nan


@dataclass(frozen=True)
class PredictorError:
    """How far predictions are from the truth, on held-out requests.

    Attributes:
        num_requests: requests evaluated.
        mae: mean absolute error, tokens.
        median_relative_error: median of |predicted - true| / true.
        within_2x: fraction of predictions within a factor of 2 of the truth.
        spearman: Spearman's rank correlation of predicted and true lengths.
        kendall_tau: Kendall's tau-b (on a sample of at most 4,000).
    """

    num_requests: int
    mae: float
    median_relative_error: float
    within_2x: float
    spearman: float
    kendall_tau: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def prediction_error(predicted: Sequence[int], true: Sequence[int]) -> PredictorError:
    """The errors of ``predicted`` against ``true`` output lengths (tokens, >= 1).

    Raises:
        ValueError: empty or mismatched inputs.
    """
    if len(predicted) != len(true) or not true:
        raise ValueError("need as many predictions as true lengths, at least one")
    abs_err = [abs(p - t) for p, t in zip(predicted, true)]
    return PredictorError(
        num_requests=len(true), mae=statistics.fmean(abs_err),
        median_relative_error=statistics.median(e / t for e, t in zip(abs_err, true)),
        within_2x=sum(t / 2 <= p <= 2 * t for p, t in zip(predicted, true)) / len(true),
        spearman=spearman(predicted, true), kendall_tau=kendall_tau_b(predicted, true))


def evaluate(predictor: OutputLengthPredictor, prompt_lens: Sequence[int],
             output_lens: Sequence[int]) -> PredictorError:
    """``prediction_error`` of a predictor that predicts from the prompt length alone (``LearnedPredictor``)
    on held-out (prompt length, true output length) pairs.

    Raises:
        ValueError: as ``prediction_error``; a predictor without ``predict_length``.
    """
    if not hasattr(predictor, "predict_length"):
        raise ValueError(f"{predictor!r} does not predict from prompt lengths alone")
    return prediction_error([predictor.predict_length(p) for p in prompt_lens], list(output_lens))

"""Fit the step cost model to this machine: ``calibrate(engine)`` measures real steps and fits the ``cpu`` preset.

The GPU presets come from datasheets; a CPU running a tiny model has no datasheet that predicts its steps
(Python overhead, cache effects, one thread). So measure: a sweep of prefill sizes (one request, one step) and
decode batch sizes (``b`` requests, one token each, after their prefill), threads pinned, warm-up steps first,
the median of repeats per point. Then fit, by least squares on relative errors with non-negative coefficients,

    t = step_overhead + per_request_overhead x requests + FLOPs / flop_rate + bytes / byte_rate

(FLOPs and bytes from ``StepCostModel`` for the engine's own model shape) and report the fit: R^2 and the worst
relative error over the points. The result is a ``Hardware`` with ``combine="sum"`` (a CPU does not overlap
its compute with its memory traffic the way a GPU's roofline assumes).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from minengine.timing.cost_model import StepCostModel, StepWork
from minengine.timing.hardware import Hardware
from minengine.timing.model_shape import ModelShape

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_FREE = 1e18  # a rate for a coefficient the fit drives to zero ("costs nothing measurable")


@dataclass(frozen=True)
class CalibrationPoint:
    """One measured configuration: ``kind`` "prefill" (``size`` prompt tokens) or "decode" (``size`` requests),
    its ``work``, the median measured seconds, the fitted model's seconds, and all samples."""

    kind: str
    size: int
    work: StepWork
    measured_s: float
    predicted_s: float = 0.0
    samples: tuple[float, ...] = ()

    @property
    def relative_error(self) -> float:
        return abs(self.predicted_s - self.measured_s) / self.measured_s


@dataclass
class CalibrationResult:
    """The fitted hardware, the model shape it was fitted for, the points, and the quality of the fit.

    Attributes:
        hardware: the fitted ``Hardware`` (use it as the ``cpu`` preset on this machine).
        shape: the engine's model shape (``ModelShape.from_hf_config`` of its config, its dtype).
        points: every measured point with its prediction.
        r2: coefficient of determination of the fit over the points' seconds.
        worst_relative_error: max over points of |predicted - measured| / measured.
        threads: torch threads during the measurement.
    """

    hardware: Hardware
    shape: ModelShape
    points: list[CalibrationPoint] = field(default_factory=list)
    r2: float = 0.0
    worst_relative_error: float = 0.0
    threads: int = 1

    def cost_model(self) -> StepCostModel:
        """A ``StepCostModel`` of the fitted hardware for the engine's shape."""
        return StepCostModel(self.hardware, self.shape)

    def as_table(self) -> str:
        """The points as a Markdown table (measured vs fitted milliseconds)."""
        rows = ["| step | tokens | measured (ms) | fitted (ms) | error |", "|---|---:|---:|---:|---:|"]
        for p in self.points:
            label = f"prefill {p.size}" if p.kind == "prefill" else f"decode batch {p.size}"
            rows.append(f"| {label} | {p.work.num_tokens} | {p.measured_s * 1e3:.2f} | {p.predicted_s * 1e3:.2f} "
                        f"| {p.relative_error:+.0%} |".replace("+", ""))
        h = self.hardware
        rows.append(f"\nfit: {h.step_overhead_s * 1e3:.2f} ms per step + {h.per_request_overhead_s * 1e6:.0f} us per "
                    f"request + FLOPs at {h.peak_flops / 1e9:.1f} GFLOP/s + bytes at {h.memory_bandwidth / 1e9:.1f} "
                    f"GB/s; R^2 {self.r2:.3f}, worst error {self.worst_relative_error:.0%} ({self.threads} thread"
                    f"{'s' if self.threads > 1 else ''})")
        return "\n".join(rows)


def engine_shape(engine) -> ModelShape:
    """The ``ModelShape`` of the model an engine has loaded, in the engine's dtype."""
    return ModelShape.from_hf_config(engine.hf_config, name=Path(str(engine.model_path)).name,
                                     dtype_bytes=_DTYPE_BYTES[engine.config.dtype])


def _nnls(rows: list[list[float]], targets: list[float]) -> list[float]:
    """Least squares with non-negative coefficients (active set: drop the most negative, refit)."""
    import numpy as np

    a, b = np.asarray(rows, dtype=float), np.asarray(targets, dtype=float)
    active = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        if active:
            coef[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
        negative = [i for i in active if coef[i] < 0]
        if not negative:
            return coef.tolist()
        active.remove(min(negative, key=lambda i: coef[i]))


def fit_hardware(points: Sequence[CalibrationPoint], shape: ModelShape, name: str = "CPU (fitted)",
                 source: str = "") -> tuple[Hardware, list[CalibrationPoint], float, float]:
    """Fit ``t = c0 + c1 x requests + c2 x FLOPs + c3 x bytes`` to measured points (relative least squares,
    coefficients >= 0). Returns (hardware, points with predictions, R^2, worst relative error).

    Raises:
        ValueError: fewer than 4 points.
    """
    if len(points) < 4:
        raise ValueError(f"need at least 4 calibration points, got {len(points)}")
    probe = StepCostModel(Hardware("probe", peak_flops=1.0, memory_bandwidth=1.0, mfu=1.0, mbu=1.0,
                                   step_overhead_s=0.0), shape)
    feats = []
    for p in points:
        c = probe.cost(p.work)
        feats.append([1.0, float(len(p.work.requests)), c.flops, c.bytes])
    scale = [1.0, 1.0, 1e-9, 1e-9]  # keep the columns of similar size
    rows = [[f * s / p.measured_s for f, s in zip(fs, scale)] for fs, p in zip(feats, points)]
    coef = _nnls(rows, [1.0] * len(points))
    c0, c1, c2, c3 = (c * s for c, s in zip(coef, scale))
    hw = Hardware(name=name, peak_flops=1 / c2 if c2 > 0 else _FREE, memory_bandwidth=1 / c3 if c3 > 0 else _FREE,
                  host_link_bandwidth=1 / c3 if c3 > 0 else _FREE, mfu=1.0, mbu=1.0, step_overhead_s=c0,
                  per_request_overhead_s=c1, allreduce_latency_s=0.0, combine="sum", source=source)
    model = StepCostModel(hw, shape)
    fitted = [CalibrationPoint(p.kind, p.size, p.work, p.measured_s, model.cost(p.work).time_s, p.samples)
              for p in points]
    mean = statistics.fmean(p.measured_s for p in fitted)
    ss_res = sum((p.predicted_s - p.measured_s) ** 2 for p in fitted)
    ss_tot = sum((p.measured_s - mean) ** 2 for p in fitted)
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else 0.0
    return hw, fitted, r2, max(p.relative_error for p in fitted)


def _timed_step(engine, timer: Callable[[], float]) -> float:
    started = timer()
    engine.step()
    return timer() - started


def calibrate(engine, prefill_sizes: Sequence[int] = (16, 32, 64, 128, 256, 512),
              decode_batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32), decode_context: int = 128,
              repeats: int = 5, warmup: int = 2, threads: int | None = 1,
              timer: Callable[[], float] = time.process_time, seed: int = 0) -> CalibrationResult:
    """Measure ``engine``'s step times over a sweep and fit the CPU cost model to them.

    Prefill sizes larger than the engine's token budget or ``max_model_len``, and decode batches larger than
    its sequence slots or KV pool, are left out. Prompts are random token ids (a fresh draw per repeat, so the
    prefix cache never hits). The engine must be idle; it is idle again afterwards (its stats are reset).

    Args:
        engine: an ``LLMEngine`` (any model; the fit is for its model shape).
        prefill_sizes: prompt lengths, tokens; each point times one whole-prompt step.
        decode_batch_sizes: numbers of decoding requests; each point times steps of that many decodes.
        decode_context: prompt tokens of the decoding requests.
        repeats, warmup: timed and untimed repetitions per point (the median is kept).
        threads: torch threads during the measurement (restored afterwards); None = leave as is.
        timer: the time source: this process's CPU time by default (with one thread, the step's compute; other
            work on a shared machine does not leak into it), ``time.perf_counter`` for wall time.

    Returns:
        ``CalibrationResult`` (``.hardware`` is the fitted preset).

    Raises:
        ValueError: the engine has unfinished requests, ``repeats`` < 1, fewer than 4 usable points.
    """
    import torch  # only here: the cost model itself needs no torch

    from minengine.sampling_params import SamplingParams

    if engine.has_unfinished_requests():
        raise ValueError("calibrate needs an idle engine (it has unfinished requests)")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    cfg = engine.config
    vocab = engine.hf_config.vocab_size
    rng = random.Random(seed)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    counter = 0

    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    def add(n_prompt: int, max_tokens: int) -> str:
        nonlocal counter
        counter += 1
        rid = f"calibrate-{counter}"
        engine.add_request(rid, {"prompt_token_ids": ids(n_prompt)},
                           SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        return rid

    points: list[CalibrationPoint] = []
    try:
        limit = min(cfg.max_num_batched_tokens, cfg.max_model_len - 1)
        for p in sorted({p for p in prefill_sizes if 1 <= p <= limit}):
            samples, work = [], None
            for r in range(warmup + repeats):
                add(p, 1)
                dt = _timed_step(engine, timer)
                if r >= warmup:
                    samples.append(dt)
                    work = StepWork.from_step_trace(engine.traces[-1])
                while engine.has_unfinished_requests():
                    engine.step()
            points.append(CalibrationPoint("prefill", p, work, statistics.median(samples), samples=tuple(samples)))
        for b in sorted(set(decode_batch_sizes)):
            # the first requests decode while the last ones still prefill: enough tokens that none finishes early
            max_tokens = warmup + repeats + 2 + -(-b * decode_context // cfg.max_num_batched_tokens)
            blocks_per_request = -(-(decode_context + max_tokens) // cfg.block_size)
            if b < 1 or b > cfg.max_num_seqs or b * blocks_per_request > engine.num_kv_blocks \
                    or decode_context + max_tokens > cfg.max_model_len:
                continue
            rids = [add(decode_context, max_tokens) for _ in range(b)]
            while any(engine.scheduler.requests[r].num_computed_tokens < decode_context for r in rids):
                engine.step()  # prefill them
            samples, works = [], []
            for r in range(warmup + repeats):
                dt = _timed_step(engine, timer)
                chunks = engine.traces[-1].chunks
                if r >= warmup and len(chunks) == b and all(c.num_tokens == 1 for c in chunks):
                    samples.append(dt)
                    works.append(StepWork.from_step_trace(engine.traces[-1]))
            engine.abort_request(rids)
            if samples:
                mid = sorted(range(len(samples)), key=samples.__getitem__)[len(samples) // 2]
                points.append(CalibrationPoint("decode", b, works[mid], statistics.median(samples),
                                               samples=tuple(samples)))
    finally:
        if threads is not None:
            torch.set_num_threads(old_threads)
        engine.reset_stats()
    shape = engine_shape(engine)
    n_threads = threads if threads is not None else old_threads
    source = (f"minengine.timing.calibrate on {os.cpu_count()} CPUs, {n_threads} torch thread(s), {cfg.dtype}, "
              f"model {shape.name}, {time.strftime('%Y-%m-%d')}")
    hw, fitted, r2, worst = fit_hardware(points, shape, name=f"CPU ({os.cpu_count()} cores, fitted)", source=source)
    return CalibrationResult(hardware=hw, shape=shape, points=fitted, r2=r2, worst_relative_error=worst,
                             threads=n_threads)

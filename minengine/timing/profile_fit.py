"""Fit the GPU presets' kernel parameters on measured operator profiles (Vidur, Agrawal et al., MLSys 2024).

Vidur ("Vidur: A Large-Scale Simulation Framework for LLM Inference", MLSys 2024; microsoft/vidur, MIT license)
profiled every operator of a decoder layer with CUDA timers on A100 and H100 (fp16, 1 to 4,096 or 32,768 tokens,
TP 1 / 2 / 4 / 8; Llama-2-7B / 70B, Llama-3-8B / 70B shapes) and NCCL all-reduces on DGX nodes (2 KB to 64 MB, 2 to
8 GPUs). The project reads those files from ``../shared/data/profiles/vidur`` (``compute/<gpu>/<org>/<model>/
mlp.csv``, ``network/<gpu>_dgx/all_reduce.csv``; see that folder's README) and fits, per GPU, what the step cost
model (``minengine.timing.cost_model``) charges, in three stages:

1. Weight streaming (rows with <= 8 tokens): a layer's four GEMMs take ``4 x kernel_floor_s + bytes /
   (bandwidth x mbu)``; linear least squares on relative errors gives the per-kernel floor and the memory
   efficiency ``mbu``.
2. The GEMMs at every token count ``T``: a soft roofline ``(c^k + m^k)^(1/k) + 4 x kernel_floor_s`` with
   ``c = FLOPs / (peak x e(T))``, ``e(T) = mfu x T / (T + gemm_half_tokens)`` and ``m = bytes / (bandwidth x
   mbu)``; Levenberg-Marquardt on log-time residuals over all rows gives ``mfu``, ``gemm_half_tokens`` and
   ``roofline_k`` (``k = 1`` adds compute and memory time, ``k -> inf`` is the hard ``max``).
3. The other kernels of a layer (two RMSNorms, rotary embedding, SiLU-and-mul, a residual add) take
   ``elementwise_floor_s + bytes / (bandwidth x elementwise_efficiency)`` (linear least squares).
4. All-reduce (one node, 2 / 4 / 8 GPUs): ``allreduce_latency_s + 2 (n - 1) / n x bytes /
   allreduce_bus_bandwidth`` (ring all-reduce; linear least squares on relative errors over every size).

``python -m minengine.timing.profile_fit`` prints the fit and the presets' numbers next to it;
``tests/timing/test_profile_fit.py`` checks that ``hardware.py`` holds exactly these numbers (rounded as printed). The
profiles contain no attention kernels (the shared copy left them out) and no FP8 GEMMs: the presets' attention
terms and the FP8 path are set from cited sources instead (``hardware.py`` says which).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from minengine.timing.model_shape import ModelShape

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
# datasheet peaks of the profiled GPUs (dense fp16 tensor FLOP/s, HBM bytes/s): what the efficiencies are of
DATASHEET = {"a100": (312e12, 2.039e12), "h100": (989.5e12, 3.35e12)}
NETWORK_DIRS = {"a100": "a100_dgx", "h100": "h100_dgx"}
STREAMING_MAX_TOKENS = 8  # stage 1: rows this small stream the weights (compute is < 3 % of their time)


@dataclass(frozen=True)
class LayerSample:
    """One profiled row: a layer's GEMMs and other kernels at ``num_tokens`` tokens on one of ``tp`` GPUs.

    Attributes:
        model: the profiled model's folder name; tp, num_tokens: the row's setting.
        gemm_flops, gemm_bytes: FLOPs and bytes (weights + activations in and out, 2-byte) of the four GEMMs.
        gemm_time_s: their measured median times, summed (seconds).
        elementwise_bytes, elementwise_time_s: the same for the other five kernels.
    """

    model: str
    tp: int
    num_tokens: int
    gemm_flops: float
    gemm_bytes: float
    gemm_time_s: float
    elementwise_bytes: float
    elementwise_time_s: float


@dataclass(frozen=True)
class KernelFit:
    """The fitted kernel parameters of one GPU (fields as on ``Hardware``), and how well they fit.

    ``gemm_errors`` / ``elementwise_errors`` / ``allreduce_errors``: (median, 90th percentile, max) of
    |modelled / measured - 1| over the fitted rows; ``rows``: (GEMM rows, all-reduce rows).
    """

    gpu: str
    mfu: float
    gemm_half_tokens: float
    mbu: float
    roofline_k: float
    kernel_floor_s: float
    elementwise_efficiency: float
    elementwise_floor_s: float
    allreduce_latency_s: float
    allreduce_bus_bandwidth: float
    gemm_errors: tuple[float, float, float] = (0.0, 0.0, 0.0)
    elementwise_errors: tuple[float, float, float] = (0.0, 0.0, 0.0)
    allreduce_errors: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rows: tuple[int, int] = (0, 0)

    PARAMETERS = ("mfu", "gemm_half_tokens", "mbu", "roofline_k", "kernel_floor_s", "elementwise_efficiency",
                  "elementwise_floor_s", "allreduce_latency_s", "allreduce_bus_bandwidth")

    def preset_values(self) -> dict[str, float]:
        """The parameters as ``hardware.py`` stores them: 3 significant digits."""
        return {name: round_sig(getattr(self, name)) for name in self.PARAMETERS}

    def as_dict(self) -> dict:
        return asdict(self)


def round_sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits (how the presets store fitted numbers)."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def find_vidur_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The ``profiles/vidur`` folder: ``explicit`` if given (None when it is not one), else under
    ``$MINENGINE_DATA``, else ``../shared/data`` next to the working directory or the repository. None when none
    exists."""
    if explicit:
        c = Path(explicit)
        return c if (c / "compute").is_dir() and (c / "network").is_dir() else None
    candidates = []
    if os.environ.get("MINENGINE_DATA"):
        candidates.append(Path(os.environ["MINENGINE_DATA"]) / "profiles" / "vidur")
    candidates += [Path.cwd().parent / "shared" / "data" / "profiles" / "vidur",
                   Path(__file__).resolve().parents[3] / "shared" / "data" / "profiles" / "vidur"]
    for c in candidates:
        if (c / "compute").is_dir() and (c / "network").is_dir():
            return c
    return None


def _profile_shape(row: dict[str, str]) -> ModelShape:
    heads, hidden = int(row["n_head"]), int(row["n_embd"])
    return ModelShape("profiled", num_layers=1, hidden_size=hidden, num_heads=heads, num_kv_heads=int(row["n_kv_head"]),
                      head_dim=hidden // heads, intermediate_size=int(row["n_expanded_embd"]),
                      vocab_size=int(row["vocab_size"]), gated_mlp=row["use_gated_mlp"] == "True")


def read_layer_samples(root: Path, gpu: str) -> list[LayerSample]:
    """Every row of every ``compute/<gpu>/*/*/mlp.csv`` under ``root``, as ``LayerSample``s (median times).

    Raises:
        ValueError: no profile for ``gpu``, or a file without the expected columns (named).
    """
    files = sorted((Path(root) / "compute" / gpu).glob("*/*/mlp.csv"))
    if not files:
        raise ValueError(f"no compute/{gpu}/*/*/mlp.csv under {root}")
    out = []
    for path in files:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                try:
                    shape, tp = _profile_shape(row), int(row["num_tensor_parallel_workers"])
                    tokens = int(row["num_tokens"])
                    gemm_s = sum(float(row[f"time_stats.{op}.median"]) for op in GEMM_OPS) * 1e-3
                    elem_s = sum(float(row[f"time_stats.{op}.median"]) for op in ELEMENTWISE_OPS) * 1e-3
                except (KeyError, ValueError) as exc:
                    raise ValueError(f"{path}: a row without the profile's columns ({exc})") from None
                mats = shape.linear_shapes(tp)
                out.append(LayerSample(
                    model=path.parent.name, tp=tp, num_tokens=tokens,
                    gemm_flops=float(sum(2 * tokens * k * n for k, n in mats)),
                    gemm_bytes=float(sum(2 * (k * n + tokens * (k + n)) for k, n in mats)),
                    gemm_time_s=gemm_s, elementwise_bytes=float(tokens * shape.elementwise_bytes_per_token(tp)),
                    elementwise_time_s=elem_s))
    return out


def read_allreduce_samples(root: Path, gpu: str) -> list[tuple[int, int, float]]:
    """``(num_workers, message bytes, median seconds)`` of the single-node all-reduces in
    ``network/<gpu>_dgx/all_reduce.csv`` (Vidur's ``size`` column is bytes: 2 x fp16 elements)."""
    path = Path(root) / "network" / NETWORK_DIRS[gpu] / "all_reduce.csv"
    if not path.is_file():
        raise ValueError(f"no all-reduce profile at {path}")
    out = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            n = int(row["num_workers"])
            if int(row["devices_per_node"]) == n and n > 1:  # one node: NVLink only
                out.append((n, int(row["size"]), float(row["time_stats.all_reduce.median"]) * 1e-3))
    return out


# ---- least squares ---------------------------------------------------------------------------------------------
def _relative_lstsq(features: Sequence[Sequence[float]], measured: Sequence[float]) -> list[float]:
    """Coefficients ``c`` minimising sum((features . c) / measured - 1)^2."""
    import numpy as np

    a = np.asarray(features, dtype=float) / np.asarray(measured, dtype=float)[:, None]
    return np.linalg.lstsq(a, np.ones(len(measured)), rcond=None)[0].tolist()


def _levenberg_marquardt(residuals: Callable, p0: Sequence[float], iterations: int = 200) -> list[float]:
    """Minimise ``sum(residuals(p)^2)`` from ``p0`` (forward-difference Jacobian, adaptive damping).
    Deterministic: the same data give the same parameters."""
    import numpy as np

    p = np.asarray(p0, dtype=float)
    r = residuals(p)
    cost, damping = float(r @ r), 1e-2
    for _ in range(iterations):
        jac = np.empty((len(r), len(p)))
        for i in range(len(p)):
            step = np.zeros(len(p))
            step[i] = 1e-6
            jac[:, i] = (residuals(p + step) - r) / 1e-6
        a, g = jac.T @ jac, jac.T @ r
        while True:
            p_new = p + np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-12), -g)
            r_new = residuals(p_new)
            cost_new = float(r_new @ r_new)
            if cost_new < cost:
                improved = cost - cost_new
                p, r, cost, damping = p_new, r_new, cost_new, max(damping / 3, 1e-9)
                break
            damping *= 4
            if damping > 1e9:
                return p.tolist()
        if improved < 1e-12 * max(cost, 1e-30):
            break
    return p.tolist()


def _error_stats(modelled, measured) -> tuple[float, float, float]:
    import numpy as np

    err = np.abs(np.asarray(modelled) / np.asarray(measured) - 1)
    return (round(float(np.median(err)), 3), round(float(np.percentile(err, 90)), 3), round(float(err.max()), 3))


def soft_roofline(compute_s, memory_s, k: float):
    """``(compute^k + memory^k)^(1/k)``: between ``max`` (k -> inf) and the sum (k = 1) of the two times
    (numbers or numpy arrays)."""
    return (compute_s ** k + memory_s ** k) ** (1.0 / k)


def fit_gpu(samples: Sequence[LayerSample], allreduce: Sequence[tuple[int, int, float]], gpu: str,
            peak_flops: float | None = None, memory_bandwidth: float | None = None) -> KernelFit:
    """The staged fit of the module docstring for one GPU.

    Raises:
        ValueError: too few rows to fit (no streaming rows, no all-reduce rows).
    """
    import numpy as np

    peak, bw = (peak_flops, memory_bandwidth) if peak_flops else DATASHEET[gpu]
    tok = np.array([s.num_tokens for s in samples], dtype=float)
    flops = np.array([s.gemm_flops for s in samples])
    nbytes = np.array([s.gemm_bytes for s in samples])
    t = np.array([s.gemm_time_s for s in samples])
    stream = tok <= STREAMING_MAX_TOKENS
    if stream.sum() < 2 or not allreduce:
        raise ValueError(f"{gpu}: need streaming rows (<= {STREAMING_MAX_TOKENS} tokens) and all-reduce rows")
    n_gemm = len(GEMM_OPS)
    floor_c, inv_bw = _relative_lstsq(np.stack([np.full(stream.sum(), float(n_gemm)), nbytes[stream] / bw], 1),
                                      t[stream])
    floor, mbu = max(floor_c, 0.0), min(1.0 / inv_bw, 1.0)
    memory = nbytes / (bw * mbu)

    def model(p):  # p = (logit mfu, log half tokens, log (k - 1))
        mfu, half, k = 1 / (1 + np.exp(-p[0])), np.exp(p[1]), 1 + np.exp(p[2])
        compute = flops / (peak * mfu * tok / (tok + half))
        return soft_roofline(compute, memory, k) + n_gemm * floor

    p = _levenberg_marquardt(lambda q: np.log(model(q)) - np.log(t), [1.0, math.log(32.0), 0.0])
    mfu, half, k = 1 / (1 + math.exp(-p[0])), math.exp(p[1]), 1 + math.exp(p[2])
    if half < 0.5:  # the fit drove it to zero: the roofline and the floor already explain small token counts
        half = 0.0
        p[1] = -math.inf

    e_bytes = np.array([s.elementwise_bytes for s in samples])
    e_t = np.array([s.elementwise_time_s for s in samples])
    e_floor, e_inv = _relative_lstsq(np.stack([np.ones(len(samples)), e_bytes / bw], 1), e_t)

    n = np.array([a[0] for a in allreduce], dtype=float)
    size = np.array([a[1] for a in allreduce], dtype=float)
    ar_t = np.array([a[2] for a in allreduce])
    ring = 2 * (n - 1) / n * size
    lat, inv_bus = _relative_lstsq(np.stack([np.ones(len(n)), ring], 1), ar_t)
    return KernelFit(
        gpu=gpu, mfu=mfu, gemm_half_tokens=half, mbu=mbu, roofline_k=k, kernel_floor_s=floor,
        elementwise_efficiency=min(1.0 / e_inv, 1.0), elementwise_floor_s=max(e_floor, 0.0),
        allreduce_latency_s=max(lat, 0.0), allreduce_bus_bandwidth=1.0 / inv_bus,
        gemm_errors=_error_stats(model(p), t), elementwise_errors=_error_stats(e_floor + e_bytes / bw * e_inv, e_t),
        allreduce_errors=_error_stats(lat + ring * inv_bus, ar_t), rows=(len(samples), len(allreduce)))


def fit_profiles(root: str | os.PathLike | None = None, gpus: Sequence[str] = ("a100", "h100")) -> dict[str, KernelFit]:
    """``fit_gpu`` for every profiled GPU under ``root`` (default: ``find_vidur_dir()``).

    Raises:
        ValueError: no profile folder found.
    """
    folder = find_vidur_dir(root)
    if folder is None:
        raise ValueError("no Vidur profiles: pass the profiles/vidur folder, or put shared/data next to the "
                         "repository, or set $MINENGINE_DATA")
    return {g: fit_gpu(read_layer_samples(folder, g), read_allreduce_samples(folder, g), g) for g in gpus}


def gemm_efficiency_table(fit: KernelFit, samples: Sequence[LayerSample], peak_flops: float,
                          memory_bandwidth: float, tokens: Sequence[int] = (1, 16, 64, 128, 256, 512, 1024, 4096)
                          ) -> list[tuple[int, float, float]]:
    """``(tokens, measured, modelled)`` GEMM efficiency (FLOPs / (peak x time), medians over the profiled rows
    at that token count): the fitted curve "GEMM efficiency as a function of tokens" against the data."""
    import statistics

    out = []
    for n in tokens:
        rows = [s for s in samples if s.num_tokens == n]
        if not rows:
            continue
        measured = statistics.median(s.gemm_flops / (peak_flops * s.gemm_time_s) for s in rows)
        modelled = statistics.median(
            s.gemm_flops / (peak_flops * (soft_roofline(
                s.gemm_flops / (peak_flops * fit.mfu * n / (n + fit.gemm_half_tokens)),
                s.gemm_bytes / (memory_bandwidth * fit.mbu), fit.roofline_k) + 4 * fit.kernel_floor_s)) for s in rows)
        out.append((n, measured, modelled))
    return out


def describe(fits: dict[str, KernelFit], root: Path | None = None) -> str:
    """The fit as Markdown: parameters per GPU, errors, and the GEMM efficiency by token count."""
    lines = ["| parameter | " + " | ".join(fits) + " |", "|---|" + "---:|" * len(fits)]
    units = {"kernel_floor_s": 1e6, "elementwise_floor_s": 1e6, "allreduce_latency_s": 1e6,
             "allreduce_bus_bandwidth": 1e-9}
    names = {"kernel_floor_s": "kernel_floor (us per GEMM)", "elementwise_floor_s": "elementwise_floor (us per layer)",
             "allreduce_latency_s": "allreduce_latency (us)",
             "allreduce_bus_bandwidth": "allreduce_bus_bandwidth (GB/s)"}
    for p in KernelFit.PARAMETERS:
        vals = [f"{f.preset_values()[p] * units.get(p, 1):.4g}" for f in fits.values()]
        lines.append(f"| {names.get(p, p)} | " + " | ".join(vals) + " |")
    for label, key in (("GEMM rows: median / p90 / max error", "gemm_errors"),
                       ("other kernels: median / p90 / max error", "elementwise_errors"),
                       ("all-reduce rows: median / p90 / max error", "allreduce_errors")):
        lines.append(f"| {label} | " + " | ".join(" / ".join(f"{e:.0%}" for e in getattr(f, key))
                                                  for f in fits.values()) + " |")
    lines.append("| rows (GEMM, all-reduce) | " + " | ".join(f"{f.rows[0]}, {f.rows[1]}" for f in fits.values()) + " |")
    if root is not None:
        for gpu, f in fits.items():
            peak, bw = DATASHEET[gpu]
            table = gemm_efficiency_table(f, read_layer_samples(root, gpu), peak, bw)
            lines += ["", f"{gpu}: GEMM efficiency (FLOPs / (peak x time)) by tokens per GPU, median over rows: "
                      + ", ".join(f"{n}: {m:.2f} measured / {e:.2f} fitted" for n, m, e in table)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", help="the profiles/vidur folder (default: ../shared/data/profiles/vidur)")
    a = ap.parse_args(argv)
    root = find_vidur_dir(a.profiles)
    fits = fit_profiles(root)
    print(describe(fits, root))
    from minengine.timing.hardware import FITTED_FROM

    print("\npresets holding these numbers: " + ", ".join(f"{hw} <- {gpu}" for hw, gpu in FITTED_FROM.items()))
    for gpu, f in fits.items():
        print(f"{gpu}: " + ", ".join(f"{k}={v!r}" for k, v in f.preset_values().items()))


if __name__ == "__main__":
    main()

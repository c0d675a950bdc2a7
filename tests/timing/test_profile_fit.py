"""minengine.timing.profile_fit: the GPU presets' kernel numbers are what the fit on Vidur's profiles gives, and
the fit recovers known parameters from synthetic profiles (that part needs no data)."""

from __future__ import annotations

import math

import pytest

from minengine.timing import hardware
from minengine.timing.model_shape import LLAMA_2_7B, LLAMA_2_70B
from minengine.timing.profile_fit import (
    DATASHEET,
    KernelFit,
    LayerSample,
    find_vidur_dir,
    fit_gpu,
    fit_profiles,
    read_layer_samples,
    round_sig,
    soft_roofline,
)

VIDUR = find_vidur_dir()
needs_data = pytest.mark.skipif(VIDUR is None, reason="no ../shared/data/profiles/vidur (set MINENGINE_DATA)")


@pytest.fixture(scope="module")
def fits() -> dict[str, KernelFit]:
    return fit_profiles(VIDUR)


@needs_data
def test_presets_hold_exactly_what_the_fit_gives(fits):
    presets = {"a100": hardware.A100_KERNELS, "h100": hardware.H100_KERNELS}
    for gpu, fit in fits.items():
        assert presets[gpu] == fit.preset_values(), gpu
    for name, gpu in hardware.FITTED_FROM.items():
        hw = hardware.HARDWARE[name]
        assert {k: getattr(hw, k) for k in KernelFit.PARAMETERS} == fits[gpu].preset_values(), name
    # the presets that borrow a fit say so in their source
    for name in ("h200", "l4", "rtx4090"):
        assert "assumed" in hardware.HARDWARE[name].source


@needs_data
def test_the_fit_describes_the_profiles(fits):
    for gpu, fit in fits.items():
        median, p90, _ = fit.gemm_errors
        assert median < 0.06 and p90 < 0.16, gpu  # GEMM rows of every model, TP degree and token count
        assert fit.elementwise_errors[0] < 0.10 and fit.allreduce_errors[0] < 0.15, gpu
        assert 0.6 < fit.mfu < 0.85 and 0.75 < fit.mbu < 0.95 and 1 <= fit.roofline_k < 3, gpu
        assert 1e-6 < fit.kernel_floor_s < 1e-5 and 100e9 < fit.allreduce_bus_bandwidth < 450e9, gpu
        assert fit.rows[0] > 1000 and fit.rows[1] > 1000


@needs_data
def test_samples_count_the_gemms_of_the_profiled_shapes():
    samples = read_layer_samples(VIDUR, "h100")
    by_key = {(s.model, s.tp, s.num_tokens): s for s in samples}
    s = by_key[("Llama-2-7b-hf", 1, 1)]
    weights = sum(k * n for k, n in LLAMA_2_7B.linear_shapes(1))
    activations = sum(k + n for k, n in LLAMA_2_7B.linear_shapes())
    assert s.gemm_flops == 2 * weights and s.gemm_bytes == 2 * (weights + activations)
    s70 = by_key[("Llama-2-70b-hf", 8, 4096)]
    assert s70.gemm_flops == 2 * 4096 * sum(k * n for k, n in LLAMA_2_70B.linear_shapes(8))
    # weight streaming: a 70B layer's 1.7 GB of weights at T = 1 take ~0.6 ms on an H100 (~0.86 of 3.35 TB/s)
    assert 0.8 < 2 * sum(k * n for k, n in LLAMA_2_70B.linear_shapes(1)) / 3.35e12 / by_key[
        ("Llama-2-70b-hf", 1, 1)].gemm_time_s < 0.95


def _synthetic(mfu, mbu, k, floor, e_eff, e_floor, lat, bus) -> tuple[list[LayerSample], list]:
    peak, bw = DATASHEET["h100"]
    samples = []
    for shape in (LLAMA_2_7B, LLAMA_2_70B):
        for tp in (1, 2, 4, 8):
            mats = shape.linear_shapes(tp)
            for t in (1, 2, 4, 8, 16, 64, 128, 256, 512, 1024, 4096):
                flops = float(sum(2 * t * a * b for a, b in mats))
                nbytes = float(sum(2 * (a * b + t * (a + b)) for a, b in mats))
                gemm = soft_roofline(flops / (peak * mfu), nbytes / (bw * mbu), k) + 4 * floor
                ebytes = float(t * shape.elementwise_bytes_per_token(tp))
                samples.append(LayerSample(shape.name, tp, t, flops, nbytes, gemm, ebytes,
                                           e_floor + ebytes / (bw * e_eff)))
    allreduce = [(n, size, lat + 2 * (n - 1) / n * size / bus) for n in (2, 4, 8) for size in (2048, 1 << 20, 1 << 26)]
    return samples, allreduce


@pytest.mark.parametrize("k", [1.3, 2.5])
def test_the_fit_recovers_known_parameters(k):
    truth = dict(mfu=0.7, mbu=0.85, k=k, floor=4e-6, e_eff=0.55, e_floor=1e-5, lat=20e-6, bus=300e9)
    samples, allreduce = _synthetic(**truth)
    fit = fit_gpu(samples, allreduce, "h100")
    # stage 1 reads mbu and the floor off the streaming rows (their small compute share biases it a little)
    assert fit.mfu == pytest.approx(0.7, rel=0.02) and fit.mbu == pytest.approx(0.85, rel=0.02)
    assert fit.roofline_k == pytest.approx(k, rel=0.05) and fit.gemm_half_tokens < 1
    assert fit.kernel_floor_s == pytest.approx(4e-6, rel=0.05)
    assert fit.elementwise_efficiency == pytest.approx(0.55, rel=1e-6)
    assert fit.elementwise_floor_s == pytest.approx(1e-5, rel=1e-6)
    assert fit.allreduce_latency_s == pytest.approx(20e-6, rel=1e-6)
    assert fit.allreduce_bus_bandwidth == pytest.approx(300e9, rel=1e-6)
    assert fit.gemm_errors[2] < 0.02


def test_errors_and_rounding(tmp_path):
    with pytest.raises(ValueError, match="no compute/h100"):
        read_layer_samples(tmp_path, "h100")
    with pytest.raises(ValueError, match="no Vidur profiles"):
        fit_profiles(tmp_path / "nowhere")  # an explicit folder that is not one: no fallback
    assert round_sig(0.78341) == 0.783 and round_sig(3.9612e-6) == 3.96e-6 and round_sig(0.0) == 0.0
    assert round_sig(323_912_345_678.0) == 324e9 and math.isinf(round_sig(math.inf))

"""The memory check beside the modelled clock: weights per device against usable device memory."""

import pytest

from minengine.timing.capacity import memory_fit
from minengine.timing.hardware import get_hardware
from minengine.timing.model_shape import get_model_shape


@pytest.mark.parametrize("hardware", ["h100", "h200", "a100", "l4", "rtx4090"])
@pytest.mark.parametrize("model", ["llama-3-8b", "qwen2.5-7b", "llama-3-70b"])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_fit_is_weights_over_tp_against_ninety_percent_of_memory(hardware, model, tp):
    fit = memory_fit(hardware, model, tp)
    shape, hw = get_model_shape(model), get_hardware(hardware)
    assert fit.weight_bytes_per_device == pytest.approx(shape.num_params * shape.dtype_bytes / tp)
    assert fit.fits == (fit.weight_bytes_per_device < 0.9 * hw.memory_bytes)
    assert fit.kv_bytes_per_device == (0.9 * hw.memory_bytes - fit.weight_bytes_per_device if fit.fits else 0.0)
    # more GPUs never make a fitting deployment stop fitting
    if fit.fits:
        assert memory_fit(hardware, model, tp * 2).fits


def test_known_deployments():
    assert not memory_fit("h100", "llama-3-70b", 1).fits  # ~141 GB of BF16 weights on one 80 GB GPU
    assert memory_fit("h100", "llama-3-70b", 4).fits
    assert not memory_fit("l4", "llama-3-70b", 4).fits  # 4 x 24 GB
    assert memory_fit("l4", "llama-3-8b", 1).fits
    assert memory_fit("h100", get_model_shape("llama-3-70b").with_(dtype_bytes=1), 2).fits  # FP8 on 2 GPUs


@pytest.mark.parametrize("kwargs, field", [({"tp": 0}, "tp"), ({"tp": 1.5}, "tp"),
                                           ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
                                           ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization")])
def test_bad_input_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        memory_fit("h100", "llama-3-8b", **kwargs)

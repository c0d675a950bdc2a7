"""Naming the clock on a figure: every figure whose axis is time says which clock that time is on (a modelled
GPU, or measured CPU time), as the title's subtitle, so a picture is never read as more than it is; and the
dashboard's clock choices (``minengine.timing.ClockSpec``)."""

from __future__ import annotations

from minengine.timing import ClockSpec, get_hardware, get_model_shape

TOP_MARGIN = 84  # px: room for a title and its one-line subtitle

# What the dashboard offers: every hardware preset, and these target model shapes as (preset, tensor parallel).
DASHBOARD_HARDWARE = ("h100", "h200", "a100", "l4", "rtx4090", "cpu")
DASHBOARD_MODELS = (("llama-3-8b", 1), ("qwen2.5-7b", 1), ("llama-3-70b", 4), ("llama-3-70b", 8), ("bundled", 1))
CLOCK_CHOICES = ("modelled", "cpu")  # modelled (the default: the same pictures on every machine), measured CPU time
DEFAULT_CLOCK = ClockSpec("modelled", hardware="h100", model="llama-3-8b")


def titled(text: str, clock_label: str | None = None) -> dict:
    """A Plotly ``layout.title`` with ``text`` and, when given, ``clock_label`` as its subtitle (e.g. "modelled:
    H100 SXM, Llama-3-8B shapes"). Use with a top margin of at least ``TOP_MARGIN`` px."""
    title: dict = {"text": text}
    if clock_label:
        title["subtitle"] = {"text": clock_label}
    return title


def model_choice_label(model: str, tp: int) -> str:
    """"Llama-3-70B, TP 4": a target model shape and its tensor-parallel degree, as the selector shows it."""
    name = get_model_shape(model).name
    return f"{name}, TP {tp}" if tp > 1 else name


def clock_label(spec: ClockSpec, lang: str = "en") -> str:
    """The clock's name for figure subtitles: "modelled: H100 SXM, Llama-3-8B shapes" / "建模：H100 SXM 上的
    Llama-3-8B 形状", "measured: CPU time" / "实测：CPU 时间" (``ClockSpec.label`` in English).

    Raises:
        ValueError: unknown language.
    """
    if lang not in ("en", "zh"):
        raise ValueError(f"lang must be 'en' or 'zh', got {lang!r}")
    if lang == "en":
        return spec.label
    if spec.kind == "modelled":
        tp = f"，TP {spec.tp}" if spec.tp > 1 else ""
        return f"建模：{get_hardware(spec.hardware).name} 上的 {get_model_shape(spec.model).name} 形状{tp}"
    return {"cpu": "实测：CPU 时间", "perf": "实测：每步挂钟时间", "wall": "挂钟时间"}[spec.kind]

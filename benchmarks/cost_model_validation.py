"""The step cost model against published end-to-end measurements: modelled vs measured, sources, errors.

Nothing here is fitted, and none of these measurements set a parameter: the GPU presets' kernel numbers come from
Vidur's operator profiles (``python -m minengine.timing.profile_fit``), attention and FP8 from cited kernel
measurements, and the engine profiles from Vidur's CPU-overhead profile and all-reduce microbenchmarks
(``minengine/timing/hardware.py``, ``engine_profile.py``). Every measured number below is copied from the public
source named next to it (``SOURCES``), with its setting; each point is modelled the way its benchmark runs:

- first-token latency / TTFT: one prefill step of the prompt (batch 1);
- static-batch throughput (TensorRT-LLM's ``gptSessionBenchmark``, ``vllm bench latency``): one prefill step of
  the whole batch, then ``output - 1`` decode steps of the whole batch at growing contexts; throughput is
  ``batch x output / time`` (per GPU where the source says so);
- mean ITL / token generation: the mean decode step of one request over its output.

The error is always on time: ``modelled time / measured time - 1`` (a throughput's time is its batch's tokens over
it). Each point runs on the engine profile of the engine that measured it: "vllm" for vLLM, "cuda-graph" for
TensorRT-LLM (and NIM's TensorRT-LLM backend) and llama.cpp. FP8 points use 1-byte weights (and a 1-byte KV cache
where the source built one: TensorRT-LLM's ``--fp8_kv_cache``).

    python benchmarks/cost_model_validation.py            # print the table
    python benchmarks/cost_model_validation.py --write    # also docs/time.md's section and the figure

The figure (``benchmarks/results/cost_model_validation.png``, rendered with headless Chromium when playwright is
installed; the same figure as a small HTML file otherwise) shows modelled vs published times, and a step's
time by kernel group against its size on one H100 for Llama-3-8B shapes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minengine.timing import LLAMA_2_7B, LLAMA_2_70B, LLAMA_3_8B, LLAMA_3_70B, ModelShape, StepCostModel

RESULTS = Path(__file__).resolve().parent / "results"
README = Path(__file__).resolve().parent.parent / "docs" / "time.md"  # the manual page that shows the table
DOCS_IMG = README.parent / "img"  # the site serves only docs/, so the page shows a copy of the figure
BEGIN, END = "<!-- cost-model-validation:begin -->", "<!-- cost-model-validation:end -->"
WITHIN = 0.30  # the band the summary counts

TRT_PERF = "TensorRT-LLM perf"
VLLM_CI = "vLLM CI"
VLLM_AR = "vLLM PR #2192"
NIM = "NIM"
LLAMA_CPP = "llama.cpp PR #4766"
SOURCES = {
    TRT_PERF: "NVIDIA TensorRT-LLM, docs/source/performance.md (github.com/NVIDIA/TensorRT-LLM, the revision with "
              "\"data has been updated for v0.6.1\"): tables \"Peak Throughput\" (static batching, "
              "gptSessionBenchmark; H100 FP8 with FP8 KV cache, out tok/s/GPU; A100 FP16, out tok/s, read per GPU "
              "as the H100 table's header says) and \"Low Latency\" (v0.5, batch 1, 1st token latency)",
    VLLM_CI: "vLLM nightly performance benchmark, latency tests (`vllm bench latency`: input 32, output 128 tokens, "
             "batch size 8, bf16), mean latency; buildkite.com/vllm/performance-benchmark/builds/9515",
    VLLM_AR: "vLLM pull request #2192 \"Custom all reduce kernels\" (github.com/vllm-project/vllm/pull/2192), table "
             "\"Latency and memory\": benchmark_latency.py, input 256, output 256, A100-80G, \"L after\" (with the "
             "custom all-reduce), seconds",
    NIM: "NVIDIA NIM for LLMs, Benchmarking guide, Performance: Llama-3.3-70b-instruct, NIM 1.8.0 (TensorRT-LLM "
         "backend), 2 x H100 80G, fp8 TP2, concurrency 1 (tables \"5000 Input Tokens / 500 Output Tokens\" and \"500 "
         "Input Tokens / 2000 Output Tokens\"); docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance",
    LLAMA_CPP: "llama.cpp pull request #4766 \"ggml-backend integration\" (github.com/ggml-org/llama.cpp/pull/4766, "
               "comment of 2024-01-10): llama-bench on an RTX 4090, llama 7B F16 (codellama-7b), pp 512 and tg 128 "
               "tokens/s",
}

MISSES = ("The model is too fast on TensorRT-LLM v0.6.1's Llama-2-70B runs with 2,048 output tokens: long GQA decodes, "
          "whose generation attention TensorRT-LLM sped up afterwards (the XQA kernel for MQA / GQA generation, "
          "docs/source/blogs/XQA-kernel.md: \"2.4x more Llama-70B throughput\"); the same engine's MHA Llama-2-7B rows "
          "and short-output 70B rows are within the band. The cause of the short 128-token FP8 prefill on 4 GPUs is "
          "not known here.")

# LLaMA-1 33B (huggyllama/llama-30b config.json): the 33B model of the vLLM PR's table
LLAMA_33B = ModelShape("LLaMA-33B", num_layers=60, hidden_size=6656, num_heads=52, num_kv_heads=52, head_dim=128,
                       intermediate_size=17920, vocab_size=32000)


@dataclass(frozen=True)
class Point:
    """One published measurement and how to model it.

    Attributes:
        what: the measurement ("1st token latency, 128-token prompt").
        setup: GPUs, model, precision, TP, engine.
        published: the source's number with its unit, as printed there.
        measured_s: that number as seconds of the run (a throughput's batch tokens over it).
        modelled: seconds of the same run on the modelled clock.
        phase: "prefill", "decode" or "both" (a static batch: one prefill and all decodes).
        source: a key of ``SOURCES``.
        gpu, tp, engine: for the summary.
    """

    what: str
    setup: str
    published: str
    measured_s: float
    modelled: Callable[[], float]
    phase: str
    source: str
    gpu: str
    tp: int
    engine: str

    @property
    def modelled_s(self) -> float:
        return self.modelled()

    @property
    def error(self) -> float:
        return self.modelled_s / self.measured_s - 1


def static_batch_time(model: StepCostModel, batch: int, prompt: int, output: int) -> float:
    """A static batch: one prefill step of ``batch`` prompts, then ``output - 1`` decode steps of the batch."""
    t = model.cost_batch(batch, prompt).time_s
    return t + sum(model.cost_batch(batch, 1, prompt + i).time_s for i in range(output - 1))


def mean_itl(model: StepCostModel, prompt: int, output: int) -> float:
    """Mean time between tokens of one request alone: its decode steps at contexts prompt .. prompt+output-2."""
    return statistics.fmean(model.cost_batch(1, 1, prompt + i).time_s for i in range(output - 1))


def _fp8(shape: ModelShape, kv: int) -> ModelShape:
    return shape.with_(name=f"{shape.name} FP8", dtype_bytes=1, kv_dtype_bytes=kv)


def points() -> list[Point]:
    rows: list[Point] = []

    def first_token(gpu, shape, tp, prompt, ms, engine, source, setup):
        m = StepCostModel(gpu, shape, tp=tp, engine=engine)
        rows.append(Point(f"1st token latency, {prompt:,}-token prompt", setup, f"{ms:,} ms", ms / 1e3,
                          lambda: m.cost([(prompt, 0, 1)]).time_s, "prefill", source, gpu, tp, engine))

    def throughput(gpu, shape, tp, batch, prompt, output, tok_s_gpu, setup):
        m = StepCostModel(gpu, shape, tp=tp, engine="cuda-graph")
        rows.append(Point(f"static batch {batch}, {prompt:,} in / {output:,} out", setup,
                          f"{tok_s_gpu:,} tok/s/GPU", batch * output / (tok_s_gpu * tp),
                          lambda: static_batch_time(m, batch, prompt, output), "both", TRT_PERF, gpu, tp,
                          "cuda-graph"))

    # TensorRT-LLM (C++ runtime with CUDA graphs): H100 FP8 (FP8 KV cache), A100 FP16
    l7_fp8, l70_fp8 = _fp8(LLAMA_2_7B, 1), _fp8(LLAMA_2_70B, 1)
    trt = "TensorRT-LLM"
    for gpu, shape, tp, latencies, setup in (
            ("h100", l7_fp8, 1, ((128, 7), (2048, 36)), f"H100, Llama-2-7B FP8, TP 1, {trt}"),
            ("h100", l70_fp8, 4, ((128, 26), (2048, 109)), f"4x H100, Llama-2-70B FP8, TP 4, {trt}"),
            ("a100", LLAMA_2_7B, 1, ((128, 16), (2048, 133)), f"A100, Llama-2-7B FP16, TP 1, {trt}"),
            ("a100", LLAMA_2_70B, 4, ((128, 47), (2048, 377)), f"4x A100, Llama-2-70B FP16, TP 4, {trt}")):
        for prompt, ms in latencies:
            first_token(gpu, shape, tp, prompt, ms, "cuda-graph", TRT_PERF, setup)
    for batch, prompt, output, thr in ((768, 128, 128, 19694), (112, 128, 2048, 6818), (80, 2048, 128, 2244),
                                       (48, 2048, 2048, 2740)):
        throughput("h100", l7_fp8, 1, batch, prompt, output, thr, f"H100, Llama-2-7B FP8, TP 1, {trt}")
    for tp, batch, prompt, output, thr in ((2, 1024, 128, 128, 2657), (4, 480, 128, 2048, 1486),
                                           (2, 96, 2048, 128, 306), (2, 64, 2048, 2048, 547)):
        throughput("h100", l70_fp8, tp, batch, prompt, output, thr, f"{tp}x H100, Llama-2-70B FP8, TP {tp}, {trt}")
    for tp, batch, prompt, output, thr in ((1, 384, 128, 128, 5586), (1, 60, 128, 2048, 1928), (1, 52, 2048, 128, 591),
                                           (2, 64, 2048, 2048, 782)):
        gpus = "A100" if tp == 1 else f"{tp}x A100"
        throughput("a100", LLAMA_2_7B, tp, batch, prompt, output, thr, f"{gpus}, Llama-2-7B FP16, TP {tp}, {trt}")
    for batch, prompt, output, thr in ((1280, 128, 128, 670), (240, 128, 2048, 525), (120, 2048, 128, 79)):
        throughput("a100", LLAMA_2_70B, 4, batch, prompt, output, thr, f"4x A100, Llama-2-70B FP16, TP 4, {trt}")

    # vLLM (a Python engine): its nightly latency benchmark, and the custom all-reduce PR's latency table
    for gpu, shape, tp, ms, setup in (("h200", LLAMA_3_8B, 1, 833.421, "H200, Llama-3.1-8B BF16, TP 1, vLLM"),
                                      ("h200", LLAMA_3_70B, 4, 2077.53, "4x H200, Llama-3-70B BF16, TP 4, vLLM")):
        m = StepCostModel(gpu, shape, tp=tp, engine="vllm")
        rows.append(Point("latency, batch 8, 32 in / 128 out", setup, f"{ms:,} ms", ms / 1e3,
                          lambda m=m: static_batch_time(m, 8, 32, 128), "both", VLLM_CI, gpu, tp, "vllm"))
    for shape, tp, s, setup in ((LLAMA_2_70B, 4, 14.57, "4x A100, Llama-70B FP16, TP 4, vLLM"),
                                (LLAMA_33B, 2, 14.38, "2x A100, LLaMA-33B FP16, TP 2, vLLM")):
        m = StepCostModel("a100", shape, tp=tp, engine="vllm")
        rows.append(Point("latency, batch 64, 256 in / 256 out", setup, f"{s} s", s,
                          lambda m=m: static_batch_time(m, 64, 256, 256), "both", VLLM_AR, "a100", tp, "vllm"))

    # NIM (TensorRT-LLM backend), Llama-3.3-70B FP8 on 2x H100 (the KV cache's dtype is not published: 16-bit)
    nim = StepCostModel("h100", _fp8(LLAMA_3_70B, 2), tp=2, engine="cuda-graph")
    setup = "2x H100, Llama-3.3-70B FP8, TP 2, NIM"
    for prompt, ms in ((5000, 406.77), (500, 47.77)):
        rows.append(Point(f"TTFT, {prompt:,}-token prompt", setup, f"{ms} ms", ms / 1e3,
                          lambda p=prompt: nim.cost([(p, 0, 1)]).time_s, "prefill", NIM, "h100", 2, "cuda-graph"))
    for prompt, output, ms in ((5000, 500, 18.58), (500, 2000, 18.91)):
        rows.append(Point(f"mean ITL, {prompt:,} in / {output:,} out", setup, f"{ms} ms", ms / 1e3,
                          lambda p=prompt, o=output: mean_itl(nim, p, o), "decode", NIM, "h100", 2, "cuda-graph"))

    # llama.cpp on an RTX 4090 (FP16 weights, FP16 accumulate: the preset's default)
    cpp = StepCostModel("rtx4090", LLAMA_2_7B, engine="cuda-graph")
    rows.append(Point("prompt processing, 512 tokens (pp 512)", "RTX 4090, llama 7B F16, TP 1, llama.cpp",
                      "11,048 tok/s", 512 / 11048.22, lambda: cpp.cost([(512, 0, 1)]).time_s, "prefill", LLAMA_CPP,
                      "rtx4090", 1, "cuda-graph"))
    rows.append(Point("token generation, 128 tokens (tg 128)", "RTX 4090, llama 7B F16, TP 1, llama.cpp",
                      "61.03 tok/s", 1 / 61.03, lambda: mean_itl(cpp, 1, 129), "decode", LLAMA_CPP, "rtx4090", 1,
                      "cuda-graph"))
    return rows


def summary(rows: list[Point]) -> dict[str, float]:
    """Points within ``WITHIN``, their count, the median and worst absolute error, GPUs, TP > 1 points."""
    errs = [abs(p.error) for p in rows]
    return {"within": sum(e <= WITHIN for e in errs), "n": len(rows), "median": statistics.median(errs),
            "worst": max(errs), "gpus": len({p.gpu for p in rows}), "tp_gt_1": sum(p.tp > 1 for p in rows),
            "phases": len({p.phase for p in rows})}


def seed_case() -> dict[str, float]:
    """Issue 8's textbook case on one H100, Llama-3-8B shapes, the default ("vllm") engine: 10 requests decoding
    (1,000-token contexts) when an 8,000-token prompt arrives. Without chunked prefill the decodes wait for the
    whole prefill step; with 512-token chunks each step is one chunk plus the 10 decodes, and each chunk reads the
    K/V of every chunk before it, so the steps grow: the first and the last chunk's steps bound the range."""
    m = StepCostModel("h100", LLAMA_3_8B)
    decodes = [(1, 1000, 1)] * 10
    prompt, chunk = 8000, 512
    steps = []
    for k, start in enumerate(range(0, prompt, chunk)):
        n = min(chunk, prompt - start)
        last = start + n == prompt
        steps.append(m.cost([(n, start, int(last))] + [(1, 1000 + k, 1)] * 10).time_s)
    return {"stall_s": m.cost([(prompt, 0, 1)] + decodes).time_s,
            "chunked_first_s": steps[0], "chunked_max_s": max(steps), "chunked_last_s": steps[-1],
            "chunked_steps": len(steps), "chunked_total_s": sum(steps),
            "chunk_alone_s": m.cost([(chunk, 0, 0)]).time_s, "decode_step_s": m.cost(decodes).time_s}


def markdown(rows: list[Point], seed: dict[str, float]) -> str:
    lines = ["| measurement | setup | published | measured | modelled | error | phase | source |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for p in rows:
        lines.append(f"| {p.what} | {p.setup} | {p.published} | {p.measured_s * 1e3:,.1f} ms | "
                     f"{p.modelled_s * 1e3:,.1f} ms | {p.error:+.0%} | {p.phase} | {p.source} |")
    s = summary(rows)
    lines += [""] + [f"- {key}: {text}" for key, text in SOURCES.items()]
    lines += ["", f"**{s['within']} of {s['n']} within ±{WITHIN:.0%}, median error {s['median']:.0%}, worst "
              f"{s['worst']:.0%}** ({s['gpus']} GPU types, {s['tp_gt_1']} points with TP > 1; error = modelled / "
              f"measured time - 1; no point set a parameter).", "",
              "Outside the band: " + "; ".join(f"{p.what}, {p.setup} ({p.error:+.0%})" for p in rows
                                               if abs(p.error) > WITHIN) + ". " + MISSES, "",
              f"The textbook case (10 requests decoding when an 8,000-token prompt arrives, one H100, "
              f"Llama-3-8B shapes, vLLM-like engine): without chunked prefill the decodes stall for "
              f"**{seed['stall_s'] * 1e3:.0f} ms** (the sources' range for this case: about 0.2-0.3 s); with "
              f"512-token chunks the {seed['chunked_steps']} steps take "
              f"**{seed['chunked_first_s'] * 1e3:.1f} to {seed['chunked_max_s'] * 1e3:.1f} ms**, growing as each "
              f"chunk reads the K/V of the chunks before it ({seed['chunked_total_s'] * 1e3:.0f} ms in all, "
              f"{seed['chunked_total_s'] / seed['stall_s']:.2f}x the unchunked step); the first is "
              f"{seed['chunked_first_s'] / seed['chunk_alone_s']:.2f}x the chunk alone "
              f"({seed['chunk_alone_s'] * 1e3:.1f} ms) and {seed['chunked_first_s'] / seed['decode_step_s']:.1f}x a "
              f"decode-only step ({seed['decode_step_s'] * 1e3:.1f} ms)."]
    return "\n".join(lines)


def figure(rows: list[Point]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "modelled vs published (log-log; band: ±30 %)",
        "one step on H100 SXM, Llama-3-8B shapes (modelled)"))
    lo, hi = 2e-3, 300.0
    fig.add_trace(go.Scatter(x=[lo, hi, hi, lo], y=[lo * 0.7, hi * 0.7, hi * 1.3, lo * 1.3], fill="toself",
                             mode="lines", fillcolor="rgba(120,120,120,0.15)", line=dict(width=0), hoverinfo="skip",
                             showlegend=False), 1, 1)
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="gray", dash="dash"),
                             showlegend=False), 1, 1)
    for phase, color in (("prefill", "#1f77b4"), ("decode", "#2ca02c"), ("both", "#d62728")):
        sel = [p for p in rows if p.phase == phase]
        fig.add_trace(go.Scatter(x=[p.measured_s for p in sel], y=[p.modelled_s for p in sel], mode="markers",
                                 marker=dict(size=10, color=color), name=f"{phase} ({len(sel)})",
                                 text=[f"{p.what}<br>{p.setup}<br>{p.error:+.0%}" for p in sel],
                                 hovertemplate="%{text}<extra></extra>"), 1, 1)
    fig.update_xaxes(type="log", title_text="published (s)", range=[-2.7, 2.5], row=1, col=1)
    fig.update_yaxes(type="log", title_text="modelled (s)", range=[-2.7, 2.5], row=1, col=1)
    m = StepCostModel("h100", LLAMA_3_8B)
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    costs = [m.cost([(n, 0, 1)]) for n in sizes]
    for name, key, color, dash in (("GEMMs", "linear_time_s", "#ff7f0e", "dot"),
                                   ("attention", "attention_time_s", "#9467bd", "dot"),
                                   ("other kernels", "elementwise_time_s", "#8c564b", "dot"),
                                   ("compute roof alone", "compute_time_s", "#ff7f0e", "dash"),
                                   ("memory roof alone", "memory_time_s", "#2ca02c", "dash"),
                                   ("step time", "time_s", "black", "solid")):
        fig.add_trace(go.Scatter(x=sizes, y=[getattr(c, key) * 1e3 for c in costs], mode="lines+markers",
                                 name=name, line=dict(color=color, dash=dash)), 1, 2)
    fig.update_xaxes(type="log", title_text="new tokens in the step (one prompt)", row=1, col=2)
    fig.update_yaxes(type="log", title_text="milliseconds", row=1, col=2)
    s = summary(rows)
    fig.update_layout(width=1000, height=440, margin=dict(l=60, r=20, t=70, b=50), template="plotly_white",
                      title=f"Step cost model: {s['within']} of {s['n']} published points within ±30 %, median "
                            f"error {s['median']:.0%}; the kernel groups of a step",
                      legend=dict(x=0.56, y=0.99, bgcolor="rgba(255,255,255,0.7)", font=dict(size=10)))
    return fig


def write_figure(fig, out_dir: Path) -> Path:
    """A PNG through headless Chromium (playwright), else a small HTML file that loads plotly.js from its CDN."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        from playwright.sync_api import sync_playwright

        with tempfile.TemporaryDirectory() as tmp:
            page_file = Path(tmp) / "figure.html"
            fig.write_html(page_file, include_plotlyjs=True, full_html=True, config={"displayModeBar": False})
            with sync_playwright() as pw:
                for path in ("/usr/bin/chromium", None):
                    try:
                        browser = pw.chromium.launch(executable_path=path) if path else pw.chromium.launch()
                        break
                    except Exception:
                        browser = None
                if browser is None:
                    raise RuntimeError("no Chromium for playwright")
                page = browser.new_page(viewport={"width": 1000, "height": 440})
                page.goto(page_file.as_uri())
                page.wait_for_selector(".main-svg")
                png = out_dir / "cost_model_validation.png"
                page.locator(".plotly-graph-div").screenshot(path=str(png))
                browser.close()
        return png
    except Exception as exc:  # no playwright / browser: keep the interactive figure, small
        print(f"(no PNG: {exc}; writing HTML instead)")
        html = out_dir / "cost_model_validation.html"
        fig.write_html(html, include_plotlyjs="cdn", full_html=True)
        return html


def update_readme(readme: Path, body: str) -> None:
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme} has no {BEGIN} ... {END} section to fill")
    head, rest = text.split(BEGIN, 1)
    readme.write_text(f"{head}{BEGIN}\n{body}\n{END}{rest.split(END, 1)[1]}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", action="store_true", help="also write the figure and the docs/time.md section")
    p.add_argument("--readme", default=str(README), help="the page with the section to fill")
    a = p.parse_args(argv)
    rows = points()
    text = markdown(rows, seed_case())
    print(text)
    if a.write:
        path = write_figure(figure(rows), RESULTS)
        if path.suffix == ".png":
            shutil.copyfile(path, DOCS_IMG / path.name)
        update_readme(Path(a.readme), text)
        print(f"\nwrote {path} and the docs/time.md section")


if __name__ == "__main__":
    main()

# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 12: host overhead and CUDA graphs: the engine's measured host time per step against a modelled GPU step at
batch 1..256; kernel launches counted on the real engine; why small-batch decode is launch-bound; what capture and
padding to batch sizes buy (padding counted), on the engine's decode-graph path; the modelled clock's engine profiles."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(12, "Host overhead and CUDA graphs", [
        "Split an engine step into host work (schedule, prepare inputs, launch kernels, process outputs) and device work, and see why they add up in a synchronous engine.",
        "Measure minengine's own host time per decode step on this CPU at 1 to 256 running requests (one thread, CPU time, medians) against a modelled H100 decode step of Llama-3-8B.",
        "Count the kernels one decode step launches on the real engine, and see why small-batch decode is launch-bound in an eager engine.",
        "Explain what capturing a CUDA graph buys (one launch per step) and what padding to capture sizes costs, counted on the engine's own decode-graph path.",
        "Read the modelled clock's engine profiles (\"vllm\", \"cuda-graph\", \"none\") and what each says about the host.",
    ], ["NVIDIA, *CUDA C++ Programming Guide*, section *CUDA Graphs*; PyTorch docs, *CUDA Graphs* (`torch.cuda.graph`)",
        "vLLM docs, *CUDA Graphs* (`cudagraph_capture_sizes`, padding a batch to the next captured size); vLLM RFC #6913 (output processing time per step)",
        "Agrawal et al., *Vidur: A Large-Scale Simulation Framework for LLM Inference*, MLSys 2024 (CPU overhead profiles, `data/profiling/a100/cpu_overheads.csv`)",
        "minengine `benchmarks/host_overhead.py` and `minengine/worker/cuda_graphs.py`; `minengine/timing/engine_profile.py`"]),
    md("""
    **Before anything imports Triton**: the last experiment runs the engine's decode-graph path on this CPU, with the
    Triton attention kernel through Triton's interpreter, which Triton picks once, at its first import. So the first cell
    sets `TRITON_INTERPRET=1` before the setup imports anything (minengine imports Triton when a kernel first runs, not before).
    """),
    code("""
    import os

    os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported anywhere in this kernel
    """),
    code(SETUP + """\
import statistics

import torch

from minengine.course import cpu_engine
from torch.utils._python_dispatch import TorchDispatchMode

from minengine.timing import StepCostModel, StepWork
from minengine.timing.model_shape import LLAMA_3_8B
from minengine.viz.cost_figures import roofs_figure
from minengine.worker.cuda_graphs import capture_sizes_for, padded_size

from minengine.layers import cpu_attention

torch.set_num_threads(1)   # everything timed here runs on one pinned torch thread
# The engine's C++ attention kernel is compiled once per machine, in the background (engines run the torch path until
# it is ready): wait for it, so every measurement and count below runs the same attention path.
cpu_attention.get_kernel(timeout_s=180)
print("CPU attention:", cpu_attention.status().message)
"""),
    md("""
    ## Two machines in one step
    A GPU engine's step runs on two processors. The **host** (CPU, Python here) schedules, builds the step's input
    tensors, launches the kernels of the forward one by one, then turns sampled ids into outputs. The **device** (GPU)
    runs the kernels. Launches are asynchronous: the host queues a kernel and moves on, so while launching takes less
    time than the kernels take to run, the host stays ahead and the GPU never waits (source: CUDA C++ Programming
    Guide, *Asynchronous Concurrent Execution*). Scheduling and output processing
    are not overlapped in a simple engine: the next step's schedule needs this step's sampled tokens. So

        step ≈ schedule + prepare inputs + max(launch all kernels, run all kernels) + process outputs

    and when launching takes longer than running, the step is **launch-bound**: the GPU idles between kernels (checked: the small model is launch-bound at the smallest batch; its GPU idles most of a batch-1 eager step). A
    **CUDA graph** records the launches of a step once and replays them with one call, so the middle term becomes the
    kernels' time.

    ## Toy: three steps on a timeline
    Toy numbers: 1 ms of scheduling and output processing, 200 kernels at 10 µs to launch each, 1.5 ms of kernels.
    """),
    code("""
    def timeline(host_ms, num_kernels, launch_us, device_ms, graphs, steps=3):
        \"\"\"(lane, start_ms, end_ms, label) bars of `steps` synchronous steps; the kernels of a step run while they are launched.\"\"\"
        bars, t = [], 0.0
        for s in range(steps):
            bars.append(("host", t, t + host_ms / 2, "schedule + inputs"))
            t += host_ms / 2
            launch_ms = 0.01 if graphs else num_kernels * launch_us / 1000      # one graph launch, or every kernel
            bars.append(("host", t, t + launch_ms, "graph launch" if graphs else "launch kernels"))
            end = t + max(launch_ms, device_ms) if not graphs else t + launch_ms + device_ms
            bars.append(("GPU", t if not graphs else t + launch_ms, end, "kernels"))
            t = end
            bars.append(("host", t, t + host_ms / 2, "outputs"))
            t += host_ms / 2
        return bars, t / steps


    lanes = {"host work": ([], [], []), "launches": ([], [], []), "kernels": ([], [], [])}   # y, width, start of each bar
    for graphs in (False, True):
        bars, per_step = timeline(host_ms=1.0, num_kernels=200, launch_us=10, device_ms=1.5, graphs=graphs)
        for lane, start, end, label in bars:
            kind = "kernels" if label == "kernels" else "launches" if "launch" in label else "host work"
            for column, value in zip(lanes[kind], (f"{'graphs' if graphs else 'eager'}: {lane}", end - start, start)):
                column.append(value)
        print(f"{'graphs' if graphs else 'eager '}: {per_step:.2f} ms per step")
    fig = go.Figure([go.Bar(y=y, x=w, base=b, orientation="h", name=kind, marker_color=color)
                     for (kind, (y, w, b)), color in zip(lanes.items(), ("#1f77b4", "#d62728", "#2ca02c"))])
    titled(fig, "Three synchronous steps: eager launches vs one graph launch per step",
           clock_label="toy numbers: 1 ms host, 200 kernels at 10 µs to launch, 1.5 ms of kernels")
    fig.update_layout(barmode="overlay", xaxis_title="time (ms)", height=330)
    fig.show()
    """),
    md("""
    ## Measure: the engine's host time per step, on this CPU
    The real engine, the bundled model, `B` requests decoding together. Three of the engine's own methods are wrapped
    with a timer of this thread's CPU time (`time.thread_time`: other processes on the machine do not inflate it):
    `Scheduler.schedule`, `ModelRunner.execute` (the step's device work: the forward, the logits, the sampler) and
    `ModelRunner.prepare_inputs` (inside execute, but host work: building the `ForwardBatch`). The host time of a step
    is the step minus the device work plus the input preparation. One torch thread, two warm-up steps, medians.
    """),
    code("""
    def timed(obj, name, samples):
        \"\"\"Wrap obj.name so every call appends its CPU time (seconds, this thread) to samples[name].\"\"\"
        inner = getattr(obj, name)

        def wrapper(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                samples.setdefault(name, []).append(time.thread_time() - t0)

        setattr(obj, name, wrapper)


    BATCHES = pick([1, 4, 16, 64, 128, 256], [1, 16, 64, 256])
    CONTEXT = 16
    host_engine = cpu_engine(max_num_seqs=max(BATCHES), max_num_batched_tokens=max(BATCHES) * CONTEXT, trace_block_tables=False,
                             num_kv_blocks=max(BATCHES) * 3 + 16)


    def host_time(batch, steps=pick(8, 4), warmup=2, context=CONTEXT, eng=host_engine):
        \"\"\"Median CPU seconds per decode step of `batch` running requests (the engine idle before): {phase: seconds}.\"\"\"
        for i in range(batch):
            eng.add_request(f"b{batch}-r{i}", {"prompt_token_ids": [(7 * i + 3 * batch + j) % 2000 + 3 for j in range(context)]},
                            SamplingParams(temperature=0.0, max_tokens=warmup + steps + 2, ignore_eos=True))
        eng.step()                                     # the prefill, not timed
        for _ in range(warmup):
            eng.step()
        samples = {}
        originals = [(obj, name, getattr(obj, name)) for obj, name in ((eng.scheduler, "schedule"), (eng.runner, "execute"), (eng.runner, "prepare_inputs"))]
        for obj, name, _ in originals:
            timed(obj, name, samples)
        for _ in range(steps):
            t0 = time.thread_time()
            eng.step()
            samples.setdefault("step", []).append(time.thread_time() - t0)
        for obj, name, _ in originals:
            delattr(obj, name)                         # back to the class's method
        run_to_completion(eng)
        med = {k: statistics.median(v) for k, v in samples.items()}
        med["host"] = med["step"] - med["execute"] + med["prepare_inputs"]
        med["update + outputs"] = med["host"] - med["schedule"] - med["prepare_inputs"]
        assert all(len(v) == steps for v in samples.values()), "one call of each phase per step"
        return med


    measured = {b: host_time(b) for b in BATCHES}
    load = os.getloadavg()[0]
    print(f"machine load (1 min): {load:.1f}; one torch thread; CPU time; medians")
    for b, m in measured.items():
        print(f"B = {b:3d}: schedule {m['schedule'] * 1e3:6.3f} ms | prepare inputs {m['prepare_inputs'] * 1e3:6.3f} ms | "
              f"update + outputs {m['update + outputs'] * 1e3:6.3f} ms | host {m['host'] * 1e3:6.3f} ms | (device work on this CPU {(m['execute'] - m['prepare_inputs']) * 1e3:6.2f} ms)")
    """),
    md("""
    ## Count the kernels one decode step launches
    On a GPU every aten operation that is not a view (a view relabels memory without a kernel) is at least one kernel launch. A
    `TorchDispatchMode` sees every aten op the engine's `ModelRunner.execute` runs for one decode step of one request:
    the whole step, and the first decoder layer alone. The bundled model has 4 layers, Llama-3-8B 32 of the same
    code.
    """),
    code("""
    VIEW_OPS = {"view", "_unsafe_view", "reshape", "slice", "select", "unsqueeze", "squeeze", "transpose", "t", "permute",
                "expand", "as_strided", "alias", "detach", "split", "chunk", "unbind", "narrow", "empty", "empty_like", "to", "lift_fresh"}


    class KernelCounter(TorchDispatchMode):
        \"\"\"Counts the aten ops that launch work (views and allocations left out).\"\"\"

        def __init__(self):
            super().__init__()
            self.ops = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in VIEW_OPS:
                self.ops[name] = self.ops.get(name, 0) + 1
            return func(*args, **(kwargs or {}))


    def count_decode_kernels(model_path=COURSE_MODEL):
        \"\"\"(kernels of one decode step of one request, kernels of decoder layer 0, number of layers) on the real engine.\"\"\"
        eng = modelled_engine(model=model_path, trace_block_tables=False)
        eng.add_request("x", {"prompt_token_ids": list(range(3, 40))}, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        eng.step()
        eng.step()                                     # warm
        layer0, whole = KernelCounter(), KernelCounter()
        layers = eng.model.model.layers
        inner = layers[0].forward

        def counted_layer(*args, **kwargs):
            with layer0:
                return inner(*args, **kwargs)

        layers[0].forward = counted_layer
        execute, prepare, inputs = eng.runner.execute, eng.runner.prepare_inputs, KernelCounter()

        def counted_execute(out):
            with whole:
                return execute(out)

        def uncounted_prepare(out):            # building the inputs is host work: its ops are taken out below
            with inputs:
                return prepare(out)

        eng.runner.execute, eng.runner.prepare_inputs = counted_execute, uncounted_prepare
        eng.step()
        for name, n_ops in inputs.ops.items():
            whole.ops[name] -= n_ops
        return whole, layer0, len(layers)


    whole, layer0, bundled_layers = count_decode_kernels()
    per_layer = sum(layer0.ops.values())
    total = sum(whole.ops.values())
    fixed = total - bundled_layers * per_layer
    print(f"one decode step: {total} kernels = {bundled_layers} layers x {per_layer} + {fixed} outside the layers (embedding, final norm, LM head, sampler)")
    print("per layer:", ", ".join(f"{k} x{v}" for k, v in sorted(layer0.ops.items(), key=lambda kv: -kv[1])))

    # This CPU's cost to issue one kernel: the bundled model's decode forward at batch 1 (hidden size 256: almost no
    # arithmetic) divided by its kernels. An upper bound of the launch path's host cost (the tiny compute is included).
    per_kernel_s = (measured[1]["execute"] - measured[1]["prepare_inputs"]) / total
    print(f"host CPU time per kernel, this CPU: {per_kernel_s * 1e6:.1f} µs (upper bound)")
    """),
    md("""
    ## Host vs device at batch 1 to 256
    Now the two sides on one axis. The device side is the modelled H100 running the decode kernels (the `"none"` engine
    profile: kernels only), every request with 1,024 tokens of context, for two model shapes: Llama-3-8B and a small
    model, Qwen2.5-0.5B (24 layers, hidden size 896, 14 query heads and 2 KV heads of 64, its published `config.json`).
    The host side is measured here: the engine's own schedule + inputs + outputs at batch `B`, and the launches of an
    **eager** forward in this engine's code (the kernels counted above, scaled to the model's layers, at this CPU's cost
    per kernel).
    """),
    code("""
    from minengine.timing import ModelShape

    QWEN_05B = ModelShape("Qwen2.5-0.5B", num_layers=24, hidden_size=896, num_heads=14, num_kv_heads=2, head_dim=64,
                          intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, qkv_bias=True)
    SHAPES = {"Llama-3-8B": LLAMA_3_8B, "Qwen2.5-0.5B": QWEN_05B}
    device = StepCostModel("h100", LLAMA_3_8B, engine="none")
    device_s = {name: {b: StepCostModel("h100", shape, engine="none").cost(StepWork.of([(1, 1024, 1)] * b)).device_time_s for b in BATCHES}
                for name, shape in SHAPES.items()}
    kernels_of = {name: fixed + shape.num_layers * per_layer for name, shape in SHAPES.items()}
    launch_of = {name: k * per_kernel_s for name, k in kernels_of.items()}
    fig = go.Figure()
    for (name, dev), color in zip(device_s.items(), ("#1f77b4", "#2ca02c")):
        fig.add_trace(go.Scatter(x=BATCHES, y=[dev[b] * 1e3 for b in BATCHES], name=f"device: {name} decode kernels (modelled H100)", mode="lines+markers", line=dict(color=color)))
        fig.add_trace(go.Scatter(x=BATCHES, y=[launch_of[name] * 1e3] * len(BATCHES), name=f"host: launching {name}'s {kernels_of[name]} kernels eagerly",
                                 mode="lines", line=dict(dash="dash", color=color)))
    fig.add_trace(go.Scatter(x=BATCHES, y=[measured[b]["host"] * 1e3 for b in BATCHES], name="host: minengine schedule + inputs + outputs (measured)",
                             mode="lines+markers", line=dict(color="#d62728")))
    titled(fig, "Host time vs device time of one decode step",
           clock_label=f"host: measured on this CPU (1 thread, CPU time, medians, load {load:.1f}); device: modelled H100 SXM, 1,024-token contexts")
    fig.update_layout(xaxis=dict(title="running decodes B", type="log", tickvals=BATCHES), yaxis=dict(title="ms per step", type="log", dtick=1),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0), height=480)
    fig.show()
    """),
    conclusion("""
    b_lo, b_hi = BATCHES[0], BATCHES[-1]
    bound = {name: [b for b in BATCHES if launch_of[name] > dev[b]] for name, dev in device_s.items()}


    def idle(name, b):
        # the share of an eager synchronous step the GPU idles: host parts, then launches and kernels overlapped
        return 1 - device_s[name][b] / (measured[b]["host"] + max(launch_of[name], device_s[name][b]))


    small, big = device_s["Qwen2.5-0.5B"], device_s["Llama-3-8B"]
    GPU_HOST_LAUNCH_S = 5e-6   # "a few microseconds" per launch on a GPU host (NVIDIA, *Getting Started with CUDA Graphs*)
    bound_gpu_host = {name: [b for b in BATCHES if kernels_of[name] * GPU_HOST_LAUNCH_S > dev[b]] for name, dev in device_s.items()}
    flip_8b = {b: big[b] / kernels_of["Llama-3-8B"] for b in (b_lo, b_hi)}   # the launch cost at which launching equals the kernels


    def batches(bs):
        return f"B = {', '.join(map(str, bs))}" if bs else "no batch"


    conclude(f"An eager decode step launches **{kernels_of['Qwen2.5-0.5B']} kernels** for Qwen2.5-0.5B and {kernels_of['Llama-3-8B']} for Llama-3-8B; "
             f"at this CPU's {per_kernel_s * 1e6:.0f} µs per kernel that is **{launch_of['Qwen2.5-0.5B'] * 1e3:.1f} ms** and "
             f"{launch_of['Llama-3-8B'] * 1e3:.1f} ms of launching. The modelled H100 runs the small model's kernels at B = {b_lo} in "
             f"**{small[b_lo] * 1e3:.2f} ms**: with this CPU's launches its step is launch-bound at {batches(bound['Qwen2.5-0.5B'])}, the GPU idle "
             f"**{idle('Qwen2.5-0.5B', b_lo):.0%}** of a batch-{b_lo} step. Llama-3-8B's kernels take {big[b_lo] * 1e3:.1f} ms at B = {b_lo}: with "
             f"this CPU's launches it is launch-bound at {batches(bound['Llama-3-8B'])}, its GPU idle {idle('Llama-3-8B', b_lo):.0%} of the step. "
             f"A GPU host launches in a few µs: at **{GPU_HOST_LAUNCH_S * 1e6:.0f} µs** per launch Qwen2.5-0.5B is launch-bound at "
             f"{batches(bound_gpu_host['Qwen2.5-0.5B'])} and **Llama-3-8B at {batches(bound_gpu_host['Llama-3-8B'])}**. Llama-3-8B's verdict flips "
             f"at **{flip_8b[b_lo] * 1e6:.1f} µs** per launch at B = {b_lo} ({flip_8b[b_hi] * 1e6:.1f} µs at B = {b_hi}): launch-bound above it, "
             f"device-bound below. Device time grows only {big[b_hi] / big[b_lo]:.1f}x from "
             f"B = {b_lo} to {b_hi} (decode is memory-bound: the weights are read once for the batch); the engine's own schedule + inputs + "
             f"outputs grow from {measured[b_lo]['host'] * 1e3:.2f} to {measured[b_hi]['host'] * 1e3:.1f} ms.",
             [("the small model is launch-bound at the smallest batch", b_lo in bound["Qwen2.5-0.5B"]),
              ("its GPU idles most of a batch-1 eager step", idle("Qwen2.5-0.5B", b_lo) > 0.5),
              ("the sentence about Llama-3-8B says what the numbers say", (b_lo in bound["Llama-3-8B"]) == (launch_of["Llama-3-8B"] > big[b_lo])),
              ("the flip point separates the two launch costs' verdicts at each end",
               all((b in bound["Llama-3-8B"]) == (per_kernel_s > flip_8b[b]) and (b in bound_gpu_host["Llama-3-8B"]) == (GPU_HOST_LAUNCH_S > flip_8b[b])
                   for b in (b_lo, b_hi))),
              ("device time grows far less than the batch", big[b_hi] / big[b_lo] < b_hi / b_lo / 10),
              ("the engine's own host time grows with the batch", measured[b_hi]["host"] > measured[b_lo]["host"]),
              ("a 4,096-token prefill's kernels run hundreds of microseconds each on average",
               device.cost(StepWork.of([(4096, 0, 1)])).device_time_s / kernels_of["Llama-3-8B"] > 100e-6)])
    """),
    md("""
    ## The modelled clock's engine profiles
    The teaching clock does not charge kernel launches one by one; it charges a step's host time through an **engine
    profile** (`minengine/timing/engine_profile.py`), because that depends on the serving engine, not on the GPU:
    - `"vllm"` (the default): a Python engine whose decode steps already replay CUDA graphs, with synchronous scheduling
      and output processing: 1.2 ms per step + 0.1 ms per request, a fit to Vidur's measured CPU overheads of Sarathi
      (a vLLM-derived engine) at batch 8-64;
    - `"cuda-graph"`: a C++ runtime replaying graphs with the scheduler overlapped (TensorRT-LLM, llama.cpp): an
      assumed 0.1 ms per step;
    - `"none"`: the kernels alone.
    """),
    code("""
    PROFILES = ("vllm", "cuda-graph", "none")
    models = {p: StepCostModel("h100", "llama-3-8b", engine=p) for p in PROFILES}
    sweep = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    step_ms = {p: [models[p].cost(StepWork.of([(1, 1024, 1)] * b)).time_s * 1e3 for b in sweep] for p in PROFILES}
    fig = go.Figure([go.Scatter(x=sweep, y=step_ms[p], name=f'engine "{p}"', mode="lines+markers") for p in PROFILES])
    titled(fig, "Modelled decode step time by engine profile (Llama-3-8B, 1,024-token contexts)", clock_label=models["vllm"].label + ", three engine profiles")
    fig.update_layout(xaxis=dict(title="running decodes B", type="log", tickvals=sweep), yaxis=dict(title="ms per step", type="log"))
    fig.show()
    pair = {f"B={b}, {p}": models[p].cost(StepWork.of([(1, 1024, 1)] * b)) for b in (1, 256) for p in ("vllm", "cuda-graph")}
    titled(roofs_figure(pair), "Compute time, memory time and the modelled step (the gap above both roofs is host time)").show()
    """),
    conclusion("""
    i1, i256 = sweep.index(1), sweep.index(256)
    share = {(p, b): models[p].cost(StepWork.of([(1, 1024, 1)] * b)).overhead_s / (step_ms[p][sweep.index(b)] / 1e3) for p in PROFILES for b in (1, 256)}
    gain_1, gain_256 = step_ms["vllm"][i1] / step_ms["cuda-graph"][i1], step_ms["vllm"][i256] / step_ms["cuda-graph"][i256]
    conclude(f'On the modelled clock the host is **{share["vllm", 1]:.0%}** of a batch-1 decode step under the "vllm" profile and '
             f'{share["vllm", 256]:.0%} at batch 256 (its 0.1 ms per request adds up); under "cuda-graph" it is {share["cuda-graph", 1]:.1%} and '
             f'{share["cuda-graph", 256]:.2%}. The overlapped graph runtime is {gain_1:.2f}x faster at batch 1 and {gain_256:.2f}x at 256: '
             f'the host work per request, not per step, is what a Python engine pays at large batch.',
             [("the gap grows with the batch", gain_256 > gain_1),
              ("host is a larger share under vllm than under cuda-graph", share["vllm", 1] > share["cuda-graph", 1] and share["vllm", 256] > share["cuda-graph", 256]),
              ("none has no host time", all(share["none", b] == 0.0 for b in (1, 256))),
              ("the graph runtime is faster at every batch", all(v > c for v, c in zip(step_ms["vllm"], step_ms["cuda-graph"]))),
              ("profiles only add host time", all(c >= n for c, n in zip(step_ms["cuda-graph"], step_ms["none"]))),
              ("vllm: 1.2 ms per step + 0.1 ms per request", (models["vllm"].engine.step_overhead_s, models["vllm"].engine.per_request_overhead_s) == (1.2e-3, 1e-4))])
    """),
    md("""
    ## What capture costs: padding to the capture sizes
    A CUDA graph replays the same kernels on the same memory with the same shapes, so an engine captures one graph per
    batch size it expects and copies each step's inputs into static buffers. It cannot capture every size (each graph
    takes capture time and memory), so a decode batch of `B` runs the graph of the smallest captured size `>= B`, the
    extra rows **padded**. The engine captures `worker/cuda_graphs.py`'s ladder (vLLM's starts 1, 2, 4 and then steps of
    8): its padding rows decode a dummy token that reads and writes one reserved KV block, and their outputs are dropped.
    """),
    code("""
    LADDER = capture_sizes_for(256)
    print("capture sizes up to max_num_seqs = 256:", LADDER)
    waste = {b: padded_size(b, LADDER) - b for b in range(1, 257)}
    pad_cost_us = {}
    for b in range(1, 257):
        real = device.cost(StepWork.of([(1, 1024, 1)] * b)).device_time_s
        padded = device.cost(StepWork.of([(1, 1024, 1)] * b + [(1, 0, 1)] * waste[b])).device_time_s   # padding rows: one key each
        pad_cost_us[b] = (padded - real) * 1e6
    fig = go.Figure([go.Bar(x=list(waste), y=list(waste.values()), name="padded rows"),
                     go.Scatter(x=list(pad_cost_us), y=list(pad_cost_us.values()), name="device time of the padding (µs)", yaxis="y2", mode="lines")])
    titled(fig, "Padding a decode batch to the next capture size", clock_label=device.label + " (kernels only), 1,024-token contexts")
    fig.update_layout(xaxis_title="decode batch B", yaxis_title="padded rows", yaxis2=dict(title="µs added", overlaying="y", side="right", tickmode="auto", showgrid=False),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0))
    fig.show()
    """),
    conclusion("""
    rows_real, rows_padded = sum(range(1, 257)), sum(b + w for b, w in waste.items())
    worst = max(waste, key=lambda b: waste[b] / b)
    worst_pct = max(pad_cost_us[b] / (device.cost(StepWork.of([(1, 1024, 1)] * b)).device_time_s * 1e6) for b in waste)
    conclude(f"With {len(LADDER)} capture sizes, batches of 1 to 256 (each equally likely) run **{rows_padded / rows_real - 1:.1%} more rows** "
             f"than they need; the worst relative case is B = {worst}, padded to {worst + waste[worst]}. On the modelled H100 a padded row costs "
             f"little because decode is memory-bound: the padding adds at most **{worst_pct:.1%}** to a step's device time, against "
             f"the host time a graph saves ({launch_of['Llama-3-8B'] * 1e3:.1f} ms of eager launches for Llama-3-8B here).",
             [("every batch fits a capture size", all(w >= 0 for w in waste.values())),
              ("batches equal to a capture size need no padding", all(waste[s] == 0 for s in LADDER)),
              ("padding costs under 10 % of a step's device time", worst_pct < 0.10),
              ("the padding costs less than the launches it replaces", max(pad_cost_us.values()) / 1e6 < launch_of["Llama-3-8B"])])
    """),
    md("""
    ## The real thing: the engine's decode-graph path
    `ModelRunner(cuda_graphs=True)` builds `DecodeGraphs`: static input buffers for up to `max_num_seqs` decodes, one graph
    per capture size (captured at start-up on CUDA), the padding rows writing into one extra KV block that no request
    ever gets. On a CPU there is no graph to capture, so the same static buffers and padding rows run eagerly
    (`capture=False`), through the Triton attention kernel in the interpreter: that is how the padding is tested here.
    A one-layer random-weight Llama (saved, then loaded by the engine's own loader) keeps the interpreter quick. Five
    requests finish at different steps, so the decode batch shrinks 5, 4, 3, 2, 1:
    """),
    code("""
    import tempfile

    from transformers import LlamaConfig, LlamaForCausalLM

    from minengine.worker.model_runner import ModelRunner

    tiny_dir = tempfile.mkdtemp(prefix="minengine-ch12-")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)).save_pretrained(tiny_dir)
    graph_prompts = [[(7 * i + j) % 500 + 3 for j in range(n)] for i, n in enumerate((5, 3, 7, 4, 6))]
    graph_params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (6, 2, 4, 3, 5)]


    def graph_llm():
        llm = LLM(tiny_dir, max_model_len=128, max_num_seqs=8, max_num_batched_tokens=64)
        e = llm.llm_engine
        e.runner = ModelRunner(e.model, e.num_kv_blocks, e.config.block_size, seed=e.config.seed, attention_backend="triton",
                               cuda_graphs=True, max_num_seqs=8)
        return llm


    llm_g = graph_llm()
    graphs = llm_g.llm_engine.runner.graphs
    replayed, pad_slots = [], []
    inner_run = graphs.run


    def recording_run(batch):
        # the engine's DecodeGraphs.run, recording the batch size and the slots its padding rows wrote
        out = inner_run(batch)
        replayed.append(batch.num_tokens)
        pad_slots.extend(graphs.slot_mapping[batch.num_tokens:padded_size(batch.num_tokens, graphs.sizes)].tolist())
        return out


    graphs.run = recording_run
    t0 = time.perf_counter()
    graph_out = llm_g.generate([{"prompt_token_ids": p} for p in graph_prompts], graph_params, use_tqdm=False)
    print(f"{time.perf_counter() - t0:.1f} s wall (Triton interpreted)")
    plain_out = LLM(tiny_dir, max_model_len=128).generate([{"prompt_token_ids": p} for p in graph_prompts], graph_params, use_tqdm=False)
    padded_to = [padded_size(b, graphs.sizes) for b in replayed]
    print("capture sizes:", graphs.sizes, "| decode batches:", replayed, "-> run at sizes", padded_to,
          "| eager steps (prefill):", graphs.num_eager_fallbacks)
    """),
    conclusion("""
    same = all(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(graph_out, plain_out))
    pad_rows = sum(p - b for p, b in zip(padded_to, replayed))
    e_g = llm_g.llm_engine
    conclude(f"The engine replayed **{graphs.num_replays} decode steps** from its static buffers at sizes {padded_to} for batches {replayed}: "
             f"{pad_rows} padding rows in all, every one written into the reserved block {graphs.pad_block}, never a request's. The prefill "
             f"step ran eagerly ({graphs.num_eager_fallbacks}), and the greedy tokens are **identical** to the plain engine's; afterwards every "
             f"one of the {e_g.num_kv_blocks} KV blocks is free again.",
             [("every decode step went through the static buffers", graphs.num_replays == len(replayed) > 0),
              ("each ran at the smallest capture size that fits", all(p == min(s for s in graphs.sizes if s >= b) for p, b in zip(padded_to, replayed))),
              ("some steps were padded", pad_rows > 0 and len(pad_slots) == pad_rows),
              ("every padding row wrote into the reserved block", all(slot // e_g.config.block_size == graphs.pad_block for slot in pad_slots)),
              ("padding changed no token", same),
              ("no block leaked", e_g.kv_cache_manager.num_free_blocks == e_g.num_kv_blocks)])
    """),
    md("## Try it: a step under each engine profile"),
    code("""
    import ipywidgets as widgets


    def profile_step(batch=1, context=1024, engine="vllm"):
        cst = StepCostModel("h100", "llama-3-8b", engine=engine).cost(StepWork.of([(1, context, 1)] * batch))
        print(f'engine "{engine}", {batch} decodes at {context:,} tokens: step {cst.time_s * 1e3:.2f} ms = kernels {cst.device_time_s * 1e3:.2f} ms '
              f"+ host {cst.overhead_s * 1e3:.2f} ms ({cst.overhead_s / cst.time_s:.0%}); padded to {padded_size(batch, LADDER)} rows for a graph")
        titled(roofs_figure({f"B={batch}": cst}), f'One decode step, engine "{engine}"').show()


    widgets.interact_manual(profile_step, batch=widgets.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256], value=1),
                            context=widgets.SelectionSlider(options=[128, 1024, 8192, 32768], value=1024),
                            engine=widgets.Dropdown(options=list(PROFILES), value="vllm"))
    """),
    *exercise(1, """
        Write `answer_1(batch)`: how many padding rows a decode batch of `batch` requests runs with, given the engine's
        capture sizes for `max_num_seqs = 256` (`LADDER` above). The check asks the engine's own `padded_size` for several
        batch sizes, on the ladder and between its steps.
        """, "The batch runs the graph of the smallest capture size that is at least `batch`.", "answer_1",
        "answer_1 = lambda batch: min(s for s in LADDER if s >= batch) - batch",
        """
        batches = [1, 3, 8, 20, 33, 97, 161, 200, 256]
        check_function("Exercise 1: padding rows", answer_1, [(b, padded_size(b, LADDER) - b) for b in batches])
        """, wrong=["answer_1 = lambda batch: 2 ** math.ceil(math.log2(batch)) - batch  # the ladder is not powers of two past 8",
                    "answer_1 = lambda batch: min(s for s in LADDER if s > batch) - batch  # a batch equal to a size needs no padding",
                    "answer_1 = lambda batch: 0  # graphs of one size cannot run another"]),
    *exercise(2, """
        In a synchronous engine the GPU idles while the host works. Write `answer_2(host_s, device_s)`: the fraction of a
        step during which the GPU idles, for `host_s` seconds of host work not overlapped with `device_s` seconds of
        kernels. The check compares it with the modelled clock's steps (`overhead_s` against `time_s`) for several batches
        and engine profiles (rounded to 4 decimals).
        """, "The step lasts host + device; the GPU works during device.", "answer_2",
        "answer_2 = lambda host_s, device_s: host_s / (host_s + device_s)",
        """
        cases = []
        for p in ("vllm", "cuda-graph"):
            for b in (1, 16, 256):
                cst = models[p].cost(StepWork.of([(1, 1024, 1)] * b))
                cases.append(((cst.overhead_s, cst.device_time_s), round(cst.overhead_s / cst.time_s, 4)))
        rounded = answer_2 if not callable(answer_2) else (lambda h, d: round(answer_2(h, d), 4))
        check_function("Exercise 2: idle fraction of a synchronous step", rounded, cases)
        """, wrong=["answer_2 = lambda host_s, device_s: host_s / device_s  # a ratio of the two, not a share of the step",
                    "answer_2 = lambda host_s, device_s: device_s / (host_s + device_s)  # the busy fraction",
                    "answer_2 = lambda host_s, device_s: max(0.0, host_s - device_s) / device_s  # host work is not overlapped here"]),
    *exercise(3, """
        Using `per_layer` and `fixed` counted above on the bundled model, write `answer_3(num_layers)`: the kernels one eager
        decode step launches for the same architecture with `num_layers` layers. The check builds random-weight copies of
        the bundled model with 1 and 2 layers (saved, loaded by the engine) and counts their kernels the same way.
        """, "Every layer runs the same code; the embedding, the final norm, the LM head and the sampler run once.", "answer_3",
        "answer_3 = lambda num_layers: fixed + num_layers * per_layer",
        """
        from transformers import AutoConfig

        from minengine.config import BUNDLED_MODEL

        def counted(layers):
            cfg = AutoConfig.from_pretrained(COURSE_MODEL or BUNDLED_MODEL)
            cfg.num_hidden_layers = layers
            path = tempfile.mkdtemp(prefix=f"minengine-ch12-{layers}l-")
            torch.manual_seed(layers)
            LlamaForCausalLM(cfg).save_pretrained(path)
            return sum(count_decode_kernels(path)[0].ops.values())

        check_function("Exercise 3: kernels per eager decode step", answer_3, [(n, counted(n)) for n in (1, 2)] + [(bundled_layers, total)])
        """, wrong=["answer_3 = lambda num_layers: num_layers * per_layer  # the embedding, LM head and sampler launch kernels too",
                    "answer_3 = lambda num_layers: total * num_layers // bundled_layers  # scales the parts outside the layers too",
                    "answer_3 = lambda num_layers: fixed + num_layers * per_layer + 1"]),
    *question("why does a CUDA graph need static buffers and padding?", """
        The engine copies every step's inputs into the same tensors and pads the batch to a captured size. Why can a graph
        not simply be replayed on the new step's own tensors, at its own size?
        """, """
        A graph records kernel launches with their arguments frozen: the addresses of every input, output and workspace
        tensor, the grid sizes, the shapes. Replaying it reruns exactly those launches on exactly that memory. So the new
        step's inputs must be copied *into* the recorded tensors (the static buffers), and the batch must have a recorded
        shape: a graph captured for 8 rows launches 8 rows' worth of work. Capturing every batch size would cost capture
        time and memory per graph, so engines capture a ladder and pad up to the next size; the pad rows must be harmless
        (here they read and write a reserved KV block and their outputs are dropped).
        """),
    *question("what if the scheduler ran while the GPU computes?", """
        The "cuda-graph" profile assumes the scheduler is overlapped with the forward. How can the next step be scheduled
        before this step's tokens are sampled, and what does it cost?
        """, """
        Schedule step t + 1 while step t runs, assuming every running request stays running and decodes its next token; the
        sampled token ids are filled into the already-built inputs on the device when they arrive (SGLang's overlap scheduler
        and vLLM's async scheduling work this way). The host work then hides under the kernels: the step is `max(host,
        device)` instead of `host + device`. The cost is a step of delay in reacting: a request that finishes at step t still
        occupies a slot in step t + 1 (wasted work), stop strings are checked a step late, and a speculative schedule needs
        bookkeeping to roll it back.
        """),
    *question("why do engines capture graphs for decode but not for long prefills?", """
        The engine (like vLLM's default) replays decode-only steps and runs prefill steps eagerly. Why is that a good split?
        """, """
        A prefill step of thousands of tokens runs kernels of hundreds of microseconds each on average (checked: a 4,096-token prefill's kernels run hundreds of microseconds each on average), while a launch takes a few microseconds of a GPU host's time (source: NVIDIA's
        blog *Getting Started with CUDA Graphs*), so the host is ahead anyway and a graph buys almost nothing. Prefill shapes also vary with
        every chunk and prompt length, so capturing them would need many graphs or heavy padding. Decode steps are the
        opposite: small, fixed-shape (one token per request), with kernels of a few microseconds each, exactly where launches dominate (checked: the small model is launch-bound at the smallest batch).
        """),
    *summary([
        "A step is host work (schedule, inputs, launches, outputs) plus device work; in a synchronous engine the GPU waits for the host parts.",
        "An eager decode step launches hundreds of small kernels; at small batch launching them can take longer than running them: launch-bound (checked: the small model is launch-bound at the smallest batch).",
        "A CUDA graph replays a step's launches with one call, on static buffers: inputs are copied in and the batch is padded to a captured size.",
        "Padding to the capture ladder wastes some rows but little device time, since decode is memory-bound; the engine's padded path changes no token.",
        "The modelled clock charges host time per engine profile: \"vllm\" (a Python engine with graphs: 1.2 ms + 0.1 ms per request), \"cuda-graph\" (an overlapped C++ runtime), \"none\".",
    ]),
    *glossary([
        ("host / device", "主机 / 设备", "the CPU that schedules and launches / the GPU that runs the kernels"),
        ("kernel launch", "内核启动", "the host queuing one GPU kernel; costs microseconds of CPU"),
        ("launch-bound", "受启动开销限制", "the GPU waits for launches: launching takes longer than the kernels run"),
        ("CUDA graph", "CUDA 图", "a recorded sequence of kernel launches replayed with one call"),
        ("capture size", "捕获批大小", "a batch size for which a graph is recorded (vLLM: cudagraph_capture_sizes)"),
        ("padding", "填充", "extra dummy rows that bring a batch up to a captured size"),
        ("static buffer", "静态缓冲区", "the fixed input tensors a graph reads; each step copies its inputs into them"),
        ("engine profile", "引擎配置档", "the modelled clock's host cost per step and per request of a serving engine"),
    ]),
]

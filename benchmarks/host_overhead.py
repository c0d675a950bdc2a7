"""Host overhead per step: the scheduler, the runner's input preparation, the sampler and the output path, at 1 to
1,024 running decodes.

For N running requests that all decode (contexts of C tokens), it times, per step and without a model:
  - ``Scheduler.schedule()`` + ``Scheduler.update_from_output()`` (the scheduler's host time; fake sampled tokens),
  - input preparation: ``ForwardBatch.build`` with the runner's persistent ``BlockTable``, for the torch attention
    (decode groups) and for the Triton kernel (block tables),
  - the engine's whole step (``--engine``, on by default): ``LLMEngine.step()`` on a model-free runner that builds
    the ``ForwardBatch`` and runs the engine's ``Sampler`` on fixed logits of a real vocabulary ([N, V] float32,
    V = 49,152 as SmolLM's and 151,936 as Qwen2.5's), greedy or sampled (temperature 0.8, top-k 50, top-p 0.95,
    every other request seeded). The step's time splits into schedule + update, input preparation, the sampler,
    and the output path: everything else ``step()`` does (detokenizing with a byte-level BPE tokenizer of V tokens,
    ``RequestOutput`` building, request metrics, the ``StepTrace`` and the Prometheus series, which
    ``LLMEngine`` keeps by default). The logits pass is one ``amax`` over the [N, V] logits: the least any
    sampler reads, timed beside it; "host beyond the logits" is the step's total minus it.
median over ``--steps`` steps after warm-up, 1 thread, in this process's CPU time (``time.process_time``: on a
shared machine wall time also counts the turns other processes take on the core). It prints tables, and writes
markdown tables, a JSON and a plotly figure (cost vs N per context; HTML, and PNG when kaleido is installed) to
``--out``.

The tokenizer: no real 150k-token tokenizer ships offline, so one is trained (``tokenizers``' byte-level BPE, the
scheme of GPT-2, Llama 3 and Qwen2.5) on the bundled Shakespeare, the prompts under ``$MINENGINE_DATA`` and Python's
standard library sources, to exactly V tokens, and kept in ``--tokenizer-cache``; ``--tokenizer PATH`` takes a
``tokenizer.json`` instead (its vocabulary sets V).

    python benchmarks/host_overhead.py                          # N = 1..1024, C = 128..8192
    python benchmarks/host_overhead.py --num-requests 1,256 --contexts 512 --steps 10

Targets (issue 13): <= 1 ms in total per step at 256 running decodes, <= 4 ms at 1,024, linear growth at worst;
issue 35 adds the sampler and the output path to the total.
On a GPU the forward of a small model's decode step takes a few ms: host time above that idles the device.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from types import SimpleNamespace

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minengine.config import EngineConfig  # noqa: E402
from minengine.core.doors import make_scheduler  # noqa: E402
from minengine.core.kv_cache_manager import KVCacheManager, cdiv  # noqa: E402
from minengine.core.scheduler import Scheduler  # noqa: E402
from minengine.engine.llm_engine import LLMEngine  # noqa: E402
from minengine.request import Request  # noqa: E402
from minengine.sampling_params import SamplingParams  # noqa: E402
from minengine.worker.block_table import BlockTable  # noqa: E402
from minengine.worker.forward_batch import ForwardBatch  # noqa: E402
from minengine.worker.sampler import Sampler  # noqa: E402

BLOCK_SIZE = 16
RESULTS = Path(__file__).resolve().parent / "results"
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def make_decoding_scheduler(num_requests: int, context: int, extra_tokens: int,
                            enable_prefix_caching: bool = True) -> Scheduler:
    """A scheduler with ``num_requests`` running requests whose prompts (``context`` tokens, distinct) are
    already prefilled, so every following step is ``num_requests`` decodes."""
    max_len = context + extra_tokens + 1
    kv = KVCacheManager(num_requests * cdiv(max_len, BLOCK_SIZE) + 1, BLOCK_SIZE, enable_prefix_caching)
    sched = make_scheduler(kv, max_num_batched_tokens=max(num_requests * context, 1), max_num_seqs=num_requests,
                      max_model_len=max_len)
    params = SamplingParams(temperature=0, max_tokens=extra_tokens, ignore_eos=True)
    for i in range(num_requests):
        # Small ints (< 256) are shared Python objects: 1,024 x 8,192 prompt tokens stay cheap to hold.
        prompt = [3 + (i + j) % 250 for j in range(context)]
        prompt[0] = 3 + i % 250
        prompt[1] = 3 + i // 250
        sched.add_request(Request(str(i), prompt, params, arrival_time=0.0))
    out = sched.schedule()  # the whole prefill in one step (the token budget is num_requests * context)
    if len(out.scheduled) != num_requests:
        raise RuntimeError(f"expected {num_requests} prefills, got {len(out.scheduled)}")
    sched.update_from_output(out, {s.request_id: [5] for s in out.scheduled})
    return sched


def time_steps(sched: Scheduler, steps: int, warmup: int = 3) -> dict[str, float]:
    """Median CPU milliseconds per decode step of the scheduler's side and of the two input preparations."""
    tables = {"torch": BlockTable(), "triton": BlockTable()}
    timings: dict[str, list[float]] = {"schedule_update_ms": [], "prepare_torch_ms": [], "prepare_triton_ms": []}
    for i in range(warmup + steps):
        t0 = time.process_time()
        out = sched.schedule()
        t1 = time.process_time()
        ForwardBatch.build(out, BLOCK_SIZE, "cpu", tables["torch"])
        t2 = time.process_time()
        ForwardBatch.build(out, BLOCK_SIZE, "cpu", tables["triton"], attention_backend="triton")
        t3 = time.process_time()
        sched.update_from_output(out, {s.request_id: [5] for s in out.scheduled if s.sample})
        t4 = time.process_time()
        if len(out.scheduled) != sched.num_running or any(s.num_new_tokens != 1 for s in out.scheduled):
            raise RuntimeError("expected a pure decode step")
        if i >= warmup:
            timings["schedule_update_ms"].append(1e3 * ((t1 - t0) + (t4 - t3)))
            timings["prepare_torch_ms"].append(1e3 * (t2 - t1))
            timings["prepare_triton_ms"].append(1e3 * (t3 - t2))
    result = {k: statistics.median(v) for k, v in timings.items()}
    result["total_torch_ms"] = result["schedule_update_ms"] + result["prepare_torch_ms"]
    result["total_triton_ms"] = result["schedule_update_ms"] + result["prepare_triton_ms"]
    return result


def corpus_texts(max_chars: int = 40_000_000) -> list[str]:
    """Training text for the tokenizer, all offline: the bundled Shakespeare, the prompt files under
    ``$MINENGINE_DATA/prompts`` and Python's standard library sources (up to ``max_chars`` characters)."""
    data = Path(os.environ.get("MINENGINE_DATA", Path(__file__).resolve().parents[1] / "data"))
    files = sorted(glob.glob(str(data / "text" / "*.txt")) + glob.glob(str(data / "prompts" / "*")))
    files += sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/**/*.py", recursive=True))
    texts, total = [], 0
    for f in files:
        try:
            text = Path(f).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return texts


def bpe_tokenizer(vocab_size: int, cache: Path):
    """A byte-level BPE ``tokenizers.Tokenizer`` of exactly ``vocab_size`` tokens, trained on ``corpus_texts`` once
    and kept in ``cache`` (the scheme and decoder of GPT-2, Llama 3 and Qwen2.5 tokenizers, with their vocabulary
    sizes; its merges are this corpus's, not theirs)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = cache / f"host_overhead_bpe_{vocab_size}.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(corpus_texts(), trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"the corpus gave {tok.get_vocab_size()} tokens, not {vocab_size}")
    cache.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok


class LogitsRunner:
    """A model-free runner for ``LLMEngine``: ``execute`` builds the step's ``ForwardBatch`` (the CPU attention's
    inputs, with the runner's persistent ``BlockTable``) and samples with the engine's ``Sampler`` from fixed
    logits ([N, V] float32, a row per sampling request), timing both in ``times`` (CPU seconds per step)."""

    last_swap_time_s = 0.0

    def __init__(self, tokenizer, logits: torch.Tensor, max_len: int):
        self.tokenizer, self.logits = tokenizer, logits
        self.model_config = SimpleNamespace(vocab_size=logits.shape[1], max_position_embeddings=max_len,
                                            eos_token_id=None)
        self.sampler, self.table = Sampler(), BlockTable()
        self.last_logprobs, self.last_prompt_logprobs = {}, {}
        self.times: dict[str, list[float]] = {"prepare": [], "sampler": []}

    def kv_bytes_per_block(self, block_size: int) -> int:
        return block_size * 1024  # any size: the pool is sized by num_kv_blocks

    def execute(self, scheduler_output) -> dict[str, list[int]]:
        t0 = time.process_time()
        ForwardBatch.build(scheduler_output, BLOCK_SIZE, "cpu", self.table)
        t1 = time.process_time()
        sampling = [s for s in scheduler_output.scheduled if s.sample]
        tokens = self.sampler(self.logits[:len(sampling)], sampling)
        t2 = time.process_time()
        self.times["prepare"].append(t1 - t0)
        self.times["sampler"].append(t2 - t1)
        return {s.request_id: t for s, t in zip(sampling, tokens)}


MIXES = {
    "greedy": lambda i: dict(temperature=0.0),
    "sampled": lambda i: dict(temperature=0.8, top_k=50, top_p=0.95, seed=i if i % 2 else None),
}


def timed(times: list[float], fn):
    """``fn`` wrapped to append its CPU seconds to ``times``."""
    def wrapper(*args, **kwargs):
        t0 = time.process_time()
        result = fn(*args, **kwargs)
        times.append(time.process_time() - t0)
        return result
    return wrapper


def time_engine_steps(num_requests: int, context: int, tokenizer, mix: str, steps: int,
                      warmup: int = 3) -> dict[str, float]:
    """Median CPU milliseconds of the parts of ``LLMEngine.step()`` over ``steps`` pure-decode steps of
    ``num_requests`` requests (prompts of ``context`` distinct tokens, prefilled first), logits of ``tokenizer``'s
    (a ``tokenizers.Tokenizer``) vocabulary (a normal distribution, scale 2; the same every step)."""
    from transformers import PreTrainedTokenizerFast

    vocab = tokenizer.get_vocab_size()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer)  # what a checkpoint's tokenizer loads as
    g = torch.Generator().manual_seed(num_requests)
    logits = torch.randn(num_requests, vocab, generator=g) * 2
    max_len = context + steps + warmup + 4
    runner = LogitsRunner(tokenizer, logits, max_len)
    config = EngineConfig(block_size=BLOCK_SIZE, num_kv_blocks=num_requests * cdiv(max_len, BLOCK_SIZE) + 1,
                          max_num_seqs=num_requests, max_num_batched_tokens=max(num_requests * context, 1),
                          max_model_len=max_len)
    engine = LLMEngine(config, clock=time.perf_counter, runner=runner)
    sched_times: list[float] = []
    engine.scheduler.schedule = timed(sched_times, engine.scheduler.schedule)
    engine.scheduler.update_from_output = timed(sched_times, engine.scheduler.update_from_output)
    for i in range(num_requests):
        prompt = [3 + (i * 7919 + j * 104729) % (vocab - 3) for j in range(context)]  # distinct prompts
        params = SamplingParams(max_tokens=steps + warmup + 2, ignore_eos=True, **MIXES[mix](i))
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    engine.step()  # the prefills
    parts: dict[str, list[float]] = {k: [] for k in ("schedule_update", "prepare", "sampler", "outputs", "step",
                                                     "logits_pass")}
    for i in range(warmup + steps):
        del sched_times[:], runner.times["prepare"][:], runner.times["sampler"][:]
        t0 = time.process_time()
        outputs = engine.step()
        step = time.process_time() - t0
        if len(outputs) != num_requests or engine.scheduler.num_running != num_requests:
            raise RuntimeError("expected a pure decode step of every request")
        t1 = time.process_time()
        logits.amax(-1)  # one read of the logits: the least any sampler does
        logits_pass = time.process_time() - t1
        if i >= warmup:
            sched, prep, samp = sum(sched_times), runner.times["prepare"][0], runner.times["sampler"][0]
            for k, v in (("schedule_update", sched), ("prepare", prep), ("sampler", samp),
                         ("outputs", step - sched - prep - samp), ("step", step), ("logits_pass", logits_pass)):
                parts[k].append(1e3 * v)
    result = {f"{k}_ms": statistics.median(v) for k, v in parts.items()}
    result["beyond_logits_ms"] = statistics.median(s - p for s, p in zip(parts["step"], parts["logits_pass"]))
    return result


def engine_table(rows: list[dict]) -> str:
    lines = ["| running decodes | vocabulary | sampling | schedule + update (ms) | input prep (ms) | sampler (ms) | "
             "logits pass (ms) | outputs + bookkeeping (ms) | step total (ms) | host beyond the logits pass (ms) |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['num_requests']} | {r['vocab']:,} | {r['mix']} | {r['schedule_update_ms']:.3f} | "
                     f"{r['prepare_ms']:.3f} | {r['sampler_ms']:.3f} | {r['logits_pass_ms']:.3f} | "
                     f"{r['outputs_ms']:.3f} | {r['step_ms']:.3f} | {r['beyond_logits_ms']:.3f} |")
    lines.append("")
    for r in rows:
        if r["num_requests"] == 256:
            verdict = "met" if r["beyond_logits_ms"] <= 1.0 else "not met"
            lines.append(f"- 256 decodes, V = {r['vocab']:,}, {r['mix']}: {r['beyond_logits_ms']:.2f} ms of host work "
                         f"beyond one read of the logits ({r['step_ms']:.2f} ms in all; the sampler "
                         f"{1e3 * r['sampler_ms'] / 256:.1f} us per row): target <= 1 ms {verdict}.")
    return "\n".join(lines) + "\n"


def markdown_table(rows: list[dict]) -> str:
    lines = ["| running decodes | context (tokens) | schedule + update (ms) | input prep, torch attention (ms) | "
             "input prep, Triton (ms) | total, torch (ms) | total, Triton (ms) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['num_requests']} | {r['context']} | {r['schedule_update_ms']:.3f} | "
                     f"{r['prepare_torch_ms']:.3f} | {r['prepare_triton_ms']:.3f} | {r['total_torch_ms']:.3f} | "
                     f"{r['total_triton_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def make_figure(rows: list[dict]):
    """Cost per step vs running requests (log-log), one line per context and part."""
    import plotly.graph_objects as go

    fig = go.Figure()
    contexts = sorted({r["context"] for r in rows})
    colors = ["#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd", "#8c564b"]
    for context, color in zip(contexts, colors * len(contexts)):
        rs = sorted((r for r in rows if r["context"] == context), key=lambda r: r["num_requests"])
        n = [r["num_requests"] for r in rs]
        fig.add_scatter(x=n, y=[r["schedule_update_ms"] for r in rs], mode="lines+markers",
                        name=f"schedule + update, C={context}", line=dict(dash="solid", color=color))
        fig.add_scatter(x=n, y=[r["prepare_torch_ms"] for r in rs], mode="lines+markers",
                        name=f"input prep, CPU attention, C={context}", line=dict(dash="dot", color=color))
        fig.add_scatter(x=n, y=[r["prepare_triton_ms"] for r in rs], mode="lines+markers",
                        name=f"input prep, GPU (Triton), C={context}", line=dict(dash="dash", color=color))
    for n_ref, ms in ((256, 1.0), (1024, 4.0)):
        fig.add_scatter(x=[n_ref], y=[ms], mode="markers", marker=dict(symbol="x", size=12, color="black"),
                        name=f"target: {ms:g} ms at N={n_ref}")
    fig.update_layout(title="Host time per decode step vs running requests (1 thread)",
                      xaxis=dict(title="running decode requests N", type="log"),
                      yaxis=dict(title="ms per step", type="log"), width=1000, height=600)
    return fig


def parse_ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",")]
    if any(v < 1 for v in values):
        raise ValueError(f"expected positive integers, got {text!r}")
    return values


def parse_names(text: str) -> list[str]:
    names = text.split(",")
    unknown = [n for n in names if n not in MIXES]
    if unknown:
        raise ValueError(f"unknown sampling mix {unknown}; choose from {sorted(MIXES)}")
    return names


def run_engine_rows(a) -> list[dict]:
    """The engine's step at every N of ``--num-requests``, vocabulary and sampling mix (prompts of
    ``--engine-context`` tokens)."""
    from tokenizers import Tokenizer

    tokenizers = ([Tokenizer.from_file(str(a.tokenizer))] if a.tokenizer
                  else [bpe_tokenizer(v, a.tokenizer_cache) for v in a.vocabs])
    rows = []
    print(f"{'N':>5} {'V':>7} {'mix':>8} {'sched+upd':>9} {'prep':>6} {'sampler':>8} {'logits':>7} {'outputs':>8} "
          f"{'step':>8} {'beyond':>7}  (ms)")
    for tok in tokenizers:
        for mix in a.mixes:
            for n in a.num_requests:
                r = {"num_requests": n, "context": a.engine_context, "vocab": tok.get_vocab_size(), "mix": mix,
                     **time_engine_steps(n, a.engine_context, tok, mix, a.steps)}
                rows.append(r)
                print(f"{n:>5} {r['vocab']:>7} {mix:>8} {r['schedule_update_ms']:>9.3f} {r['prepare_ms']:>6.3f} "
                      f"{r['sampler_ms']:>8.3f} {r['logits_pass_ms']:>7.3f} {r['outputs_ms']:>8.3f} "
                      f"{r['step_ms']:>8.3f} {r['beyond_logits_ms']:>7.3f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=parse_ints, default=parse_ints("1,4,16,64,256,1024"))
    ap.add_argument("--contexts", type=parse_ints, default=parse_ints("128,512,2048,8192"))
    ap.add_argument("--steps", type=int, default=20, help="timed decode steps per setting (after 3 warm-up)")
    ap.add_argument("--no-engine", dest="engine", action="store_false", help="only the scheduler and input prep")
    ap.add_argument("--engine-context", type=int, default=512, help="prompt tokens of the engine's requests")
    ap.add_argument("--vocabs", type=parse_ints, default=parse_ints("49152,151936"),
                    help="vocabularies of the trained tokenizers and the logits")
    ap.add_argument("--mixes", type=parse_names, default=parse_names("greedy,sampled"))
    ap.add_argument("--tokenizer", type=Path, default=None, help="a tokenizer.json to use instead of training")
    ap.add_argument("--tokenizer-cache", type=Path, default=Path.home() / ".cache" / "minengine",
                    help="where the trained tokenizers are kept")
    ap.add_argument("--out", type=Path, default=None, help="directory for host_overhead.{md,json,html,png}")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)

    rows = []
    print(f"{'N':>5} {'C':>5} {'sched+upd ms':>12} {'prep torch ms':>13} {'prep triton ms':>14} {'total ms':>9}")
    for context in a.contexts:
        for n in a.num_requests:
            sched = make_decoding_scheduler(n, context, extra_tokens=a.steps + 8)
            r = {"num_requests": n, "context": context, **time_steps(sched, a.steps)}
            rows.append(r)
            print(f"{n:>5} {context:>5} {r['schedule_update_ms']:>12.3f} {r['prepare_torch_ms']:>13.3f} "
                  f"{r['prepare_triton_ms']:>14.3f} {r['total_torch_ms']:>9.3f}", flush=True)
            del sched
    engine_rows = run_engine_rows(a) if a.engine else []
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        md = markdown_table(rows)
        if engine_rows:
            md += "\n" + engine_table(engine_rows)
        (a.out / "host_overhead.md").write_text(md)
        (a.out / "host_overhead.json").write_text(json.dumps({"scheduler_and_inputs": rows, "engine_step": engine_rows},
                                                             indent=2))
        fig = make_figure(rows)
        fig.write_html(a.out / "host_overhead.html", include_plotlyjs="cdn")
        try:
            fig.write_image(a.out / "host_overhead.png", scale=1)
            if a.out.resolve() == RESULTS:  # docs/benchmarks.md shows a copy (the site serves only docs/)
                shutil.copyfile(RESULTS / "host_overhead.png", DOCS_IMG / "host_overhead.png")
        except Exception as exc:  # kaleido (and a browser) are optional
            print(f"no PNG ({type(exc).__name__}: {exc}); the HTML figure is written")
    return {"scheduler_and_inputs": rows, "engine_step": engine_rows}


if __name__ == "__main__":
    main()

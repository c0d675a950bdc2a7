"""Predictive scheduling on the Azure conversation trace: how much does knowing (or predicting) output lengths buy?

Issue 11, part 1. The Azure LLM inference trace 2023, conversation service (Patel et al., "Splitwise", ISCA
2024), is cut in two halves in time. The first half trains the ``LearnedPredictor`` (median output length per
prompt-length bucket); the second half evaluates it (MAE, median relative error, within 2x, Spearman, Kendall's
tau-b) beside a constant prediction (the training median) and noisy oracles of several sigma. Then a window of
the second half is replayed online, at full length, through the real scheduler on the MODELLED clock (every
step lasts what the roofline cost model says it would on ``--hardware`` for ``--model-shape``; deterministic):

- ``decode-first`` (FCFS admission, vLLM's default order), the baseline;
- ``shortest-predicted-first`` with each predictor (learned, noisy oracle, oracle) and aging;
- predicted-length-aware admission (``reserve_predicted_kv``, after S3, Jin et al., NeurIPS 2023) under FCFS
  and under shortest-predicted-first;
- a sweep of the noisy oracle's sigma under shortest-predicted-first.

Reported: mean and P99 TTFT and E2E latency, preemptions, goodput (requests/s meeting the SLO). Literature:
Fu et al., "Efficient LLM Scheduling by Learning to Rank" (NeurIPS 2024: ranking by predicted length, with
starvation prevention, cuts latency); S3 (Jin et al., 2023: predict the length, allocate KV for it).

The replay is TOKEN-FREE: ``TokenFreeRunner`` stands in for the model runner (it returns a fixed token for
every request that samples; the scheduler, KV cache manager, prefix cache, preemption and clocks are the real
ones), so full-length requests (up to 8,192 tokens, the bundled model's limit; longer ones are clipped) replay in
seconds on a laptop. Tokens do not change scheduling here: requests run to the trace's ``GeneratedTokens`` with
``ignore_eos``, which is also what makes ``OraclePredictor`` exact.

    python benchmarks/predictive.py                  # ~2-4 minutes on 2 CPU cores
    python benchmarks/predictive.py --requests 1000 --speedup 3
Prints the tables; ``--write`` also writes ``benchmarks/results/predictive.md`` and ``predictive.json`` (the
numbers docs/features/predictive.md and ``minengine.viz.predicted_vs_true_figure`` / ``policy_latency_figure`` use).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path

from minengine.config import EngineConfig
from minengine.core.predictors import (
    LearnedPredictor,
    NoisyOraclePredictor,
    OraclePredictor,
    OutputLengthPredictor,
    evaluate,
    prediction_error,
)
from minengine.engine.llm_engine import LLMEngine
from minengine.timing import ClockSpec
from minengine.workloads import SLO, find_data_dir, goodput, load_azure_trace, replay, speed_up
from minengine.workloads.traces import azure_conv_path

RESULTS = Path(__file__).resolve().parent / "results"


class TokenFreeRunner:
    """A model runner that computes nothing: every request that samples gets ``token_id`` (a decode verifying
    proposals gets that token alone, i.e. every proposal rejected). Same interface as ``ModelRunner.execute``:
    ``SchedulerOutput`` in, ``{request_id: [token ids]}`` out; swaps are bookkeeping only."""

    def __init__(self, token_id: int = 5):
        self.token_id = token_id
        self.last_logprobs: dict = {}
        self.last_prompt_logprobs: dict = {}
        self.last_swap_time_s = 0.0

    def execute(self, scheduler_output) -> dict[str, list[int]]:
        return {s.request_id: [self.token_id] for s in scheduler_output.scheduled if s.sample}


def make_engine(a: argparse.Namespace, policy: str, predictor: OutputLengthPredictor | None,
                reserve: bool) -> LLMEngine:
    config = EngineConfig(model=a.model, block_size=16, num_kv_blocks=a.num_kv_blocks,
                          max_num_batched_tokens=a.max_num_batched_tokens, max_num_seqs=a.max_num_seqs,
                          max_model_len=a.max_model_len, scheduling_policy=policy,
                          output_length_predictor=predictor, reserve_predicted_kv=reserve,
                          predicted_length_aging_steps=a.aging_steps, enable_prefix_caching=False,
                          trace_block_tables=False, seed=0)
    clock = ClockSpec("modelled", hardware=a.hardware, model=a.model_shape, block_size=16).make()
    engine = LLMEngine(config, clock=clock)
    engine.runner = TokenFreeRunner()
    return engine


def run_one(a, trace, label: str, policy: str, predictor, reserve: bool, slo: SLO) -> dict:
    engine = make_engine(a, policy, predictor, reserve)
    result = replay(engine, trace, seed=0)
    ms = list(result.request_metrics.values())
    ttft = [m.ttft for m in ms]
    e2e = [m.e2e_latency for m in ms]
    s = result.summary()
    row = {"label": label, "policy": policy, "predictor": getattr(predictor, "name", "") or "",
           "reserve_predicted_kv": reserve, "finished": s.num_requests, "requests": len(trace),
           "ttft_mean": statistics.fmean(ttft), "ttft_p99": percentile(ttft, 99),
           "e2e_mean": statistics.fmean(e2e), "e2e_p99": percentile(e2e, 99),
           "preemptions": s.num_preemptions, "goodput": goodput(result.request_metrics, slo),
           "slo_attainment": sum(1 for m in ms if _meets(m, slo)) / len(ms), "steps": s.num_steps,
           "duration_s": s.duration_s, "wall_s": result.wall_time_s}
    print(f"  {label:44s} mean E2E {row['e2e_mean']:7.2f} s  P99 TTFT {row['ttft_p99']:7.2f} s  preemptions "
          f"{row['preemptions']:5d}  ({row['wall_s']:.0f} s)", flush=True)
    return row


def _meets(m, slo: SLO) -> bool:
    from minengine.workloads.goodput import meets_slo

    return meets_slo(m, slo)


def percentile(xs, q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def error_rows(train, test, sigmas) -> tuple[list[dict], LearnedPredictor, dict]:
    """Prediction errors on the held-out half; the fitted predictor; a sample of (prompt, true, predicted)."""
    learned = LearnedPredictor().fit([r.prompt_len for r in train], [r.output_len for r in train])
    true = [r.output_len for r in test]
    rows = [{"predictor": learned.name, **evaluate(learned, [r.prompt_len for r in test], true).as_dict()}]
    const = round(statistics.median(r.output_len for r in train))
    rows.append({"predictor": f"constant (training median, {const})",
                 **prediction_error([const] * len(test), true).as_dict()})
    lengths = {r.request_id: r.output_len for r in test}
    for sigma in sigmas:
        noisy = NoisyOraclePredictor(sigma, seed=0, lengths=lengths)
        predicted = [max(1, round(r.output_len * math.exp(noisy.log_error(r.request_id)))) for r in test]
        rows.append({"predictor": noisy.name, **prediction_error(predicted, true).as_dict()})
    step = max(1, len(test) // 2000)
    sample = {"prompt_len": [r.prompt_len for r in test[::step]], "true": true[::step],
              "learned": [learned.predict_length(r.prompt_len) for r in test[::step]]}
    return rows, learned, sample


def error_table(rows: list[dict]) -> str:
    lines = ["| predictor | MAE (tokens) | median relative error | within 2x | Spearman | Kendall tau-b |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['predictor']} | {r['mae']:.0f} | {r['median_relative_error']:.2f} | {r['within_2x']:.0%} "
                     f"| {fmt(r['spearman'])} | {fmt(r['kendall_tau'])} |")
    return "\n".join(lines)


def fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}"


def policy_table(rows: list[dict]) -> str:
    lines = ["| scheduling | mean TTFT (s) | P99 TTFT (s) | mean E2E (s) | P99 E2E (s) | preemptions | goodput "
             "(req/s) | SLO met |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['ttft_mean']:.2f} | {r['ttft_p99']:.2f} | {r['e2e_mean']:.2f} "
                     f"| {r['e2e_p99']:.2f} | {r['preemptions']} | {r['goodput']:.2f} | {r['slo_attainment']:.0%} |")
    return "\n".join(lines)


def results_json(data: dict) -> str:
    """``data`` as JSON, one field per line, the long "sample" lists each on one line (a small diff)."""
    rest = json.dumps({k: v for k, v in data.items() if k != "sample"}, indent=1)
    sample = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data["sample"].items())
    return rest[:-2] + ',\n "sample": {\n' + sample + "\n }\n}\n"


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark (see the module docstring); returns {"errors", "policies", "sigma_sweep"} rows."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF checkpoint dir for the tokenizer and limits (default: bundled)")
    p.add_argument("--data-dir", default=None, help="the shared/data folder (default: ../shared/data)")
    p.add_argument("--requests", type=int, default=600, help="requests replayed from the start of the second half")
    p.add_argument("--speedup", type=float, default=1.5, help="arrivals this many times faster than the trace")
    p.add_argument("--num-kv-blocks", type=int, default=2048, help="KV pool (16-token blocks): memory contends")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--aging-steps", type=int, default=4, help="predicted_length_aging_steps")
    p.add_argument("--hardware", default="h100")
    p.add_argument("--model-shape", default="llama-3-8b")
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-tpot-ms", type=float, default=50.0)
    p.add_argument("--sigmas", type=float, nargs="*", default=[0.0, 0.25, 0.5, 1.0, 1.5, 2.0])
    p.add_argument("--write", action="store_true", help="write predictive.md and predictive.json to --out")
    p.add_argument("--out", default=str(RESULTS), help="folder --write writes to (default benchmarks/results)")
    a = p.parse_args(argv)

    path = azure_conv_path(find_data_dir(a.data_dir))
    if path is None:
        raise SystemExit("the Azure trace is missing: pass --data-dir (the shared/data folder)")
    started = time.perf_counter()
    full = load_azure_trace(path)
    half = len(full) // 2
    train, test = full[:half], full[half:]
    err_rows, learned, sample = error_rows(train, test, [s for s in a.sigmas if s > 0])
    window = speed_up(load_azure_trace(path, start_s=test[0].arrival_time, max_requests=a.requests), a.speedup)
    slo = SLO(ttft_s=a.slo_ttft_s, tpot_s=a.slo_tpot_ms / 1000)
    clock_label = ClockSpec("modelled", hardware=a.hardware, model=a.model_shape, block_size=16).label
    print(f"replaying {len(window)} requests ({window.mean_rate:.1f} req/s) on {clock_label}", flush=True)

    spf = "shortest-predicted-first"
    oracle = OraclePredictor()
    runs = [("FCFS (decode-first)", "decode-first", None, False),
            ("SPF, learned", spf, learned, False),
            ("SPF, noisy oracle sigma 1.0", spf, NoisyOraclePredictor(1.0), False),
            ("SPF, noisy oracle sigma 0.5", spf, NoisyOraclePredictor(0.5), False),
            ("SPF, oracle", spf, oracle, False),
            ("FCFS + reserve KV, learned", "decode-first", learned, True),
            ("FCFS + reserve KV, oracle", "decode-first", oracle, True),
            ("SPF + reserve KV, learned", spf, learned, True),
            ("SPF + reserve KV, oracle", spf, oracle, True)]
    rows = [run_one(a, window, *r, slo) for r in runs]
    print("sigma sweep (shortest-predicted-first, noisy oracle)", flush=True)
    sweep = [run_one(a, window, f"SPF, sigma {s:g}", spf, NoisyOraclePredictor(s), False, slo) for s in a.sigmas]

    out = ["# Predictive scheduling on the Azure conversation trace", "",
           f"Generated by `python benchmarks/predictive.py` ({time.strftime('%Y-%m-%d')}, "
           f"{platform.processor() or platform.machine()}); total {time.perf_counter() - started:.0f} s.", "",
           "## Output-length prediction, held out", "",
           f"Fit on the first {half} requests of the trace, evaluated on the other {len(test)} (the learned "
           "predictor sees only the prompt length: the trace has no text).", "", error_table(err_rows), "",
           "## Scheduling", "",
           f"{len(window)} requests from the start of the second half, arrivals x{a.speedup:g} faster "
           f"({window.mean_rate:.1f} req/s), full lengths (clipped to {a.max_model_len} tokens), greedy "
           f"`ignore_eos`. Token-free replay on the modelled clock ({clock_label}). Engine: block_size 16, "
           f"num_kv_blocks {a.num_kv_blocks} ({a.num_kv_blocks * 16} tokens), max_num_batched_tokens "
           f"{a.max_num_batched_tokens}, max_num_seqs {a.max_num_seqs}, recompute preemption, prefix caching off, "
           f"predicted_length_aging_steps {a.aging_steps}. Goodput SLO: {slo}.", "", policy_table(rows), "",
           "## Sigma sweep (shortest-predicted-first, noisy oracle)", "", policy_table(sweep), "",
           "Data: Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA 2024). Ideas: Fu et al., NeurIPS "
           "2024 (learning to rank, shortest-predicted-first with starvation prevention); Jin et al., S3, 2023 "
           "(predicted-length KV allocation)."]
    text = "\n".join(out) + "\n"
    print("\n" + text)
    if a.write:
        out_dir = Path(a.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "predictive.md").write_text(text)
        (out_dir / "predictive.json").write_text(results_json(
            {"errors": err_rows, "policies": rows, "sigma_sweep": sweep, "sample": sample,
             "settings": {k: v for k, v in vars(a).items() if k not in ("write", "out")}, "clock": clock_label,
             "rate_req_s": window.mean_rate}))
        print(f"wrote {out_dir / 'predictive.md'} and predictive.json")
    return {"errors": err_rows, "policies": rows, "sigma_sweep": sweep}


if __name__ == "__main__":
    main()

"""What structured outputs cost: unconstrained throughput before and after the feature, and constrained requests.

1. Unconstrained requests must not pay for the feature. The same workload (bundled model, 32 requests, 48-token
   prompts, 64 new tokens, greedy and sampled halves) runs on two checkouts in alternating subprocesses: ``--base``
   (a git revision without the feature, exported with ``git archive``) and this working tree. Each subprocess
   warms up once, then times ``LLM.generate`` with 1 torch thread, in the process's CPU time (``time.process_time``:
   on a shared machine wall time also counts other processes' turns; wall time is recorded too); the median over
   ``--repeats`` runs of each checkout is reported, with their ratio. Alternating shares the machine's load.
2. The constrained side, in this tree only: the same workload with every request under a JSON schema (a list of
   short strings, ``disable_any_whitespace``: outputs run to max_tokens like the unconstrained ones), its
   throughput, and the median fill time of one mask (``worker/structured_output.mask_profile`` on 8 outputs).

    python benchmarks/structured_output.py                       # base = main's merge base
    python benchmarks/structured_output.py --base 421d55a --repeats 5 --out benchmarks/results

Prints a table and writes ``structured_output.json`` / ``.md`` to ``--out``; the 1/5/15-minute load averages
before and after are recorded. No target is asserted here: the ratio is the number to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from minengine import LLM, SamplingParams
mode, n, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = LLM(num_kv_blocks=1024, max_num_seqs=64)
tok = llm.get_tokenizer()
text = "ROMEO: O, she doth teach the torches to burn bright! It seems she hangs upon the cheek of night "
ids = tok(text * 4)["input_ids"]
prompts = [{"prompt_token_ids": ids[i:i + 48]} for i in range(n)]
def params(i):
    kw = dict(max_tokens=new, ignore_eos=True) if mode == "plain" else dict(max_tokens=new)
    kw.update(temperature=0) if i % 2 == 0 else kw.update(temperature=0.8, seed=i)
    if mode == "json":
        from minengine.sampling_params import StructuredOutputsParams
        # a long list of short strings: outputs run to max_tokens, so both sides generate the same counts
        kw["structured_outputs"] = StructuredOutputsParams(json={"type": "array", "items": {"type": "string",
            "maxLength": 12}}, disable_any_whitespace=True)
    return SamplingParams(**kw)
ps = [params(i) for i in range(n)]
llm.generate(prompts[:4], ps[:4], use_tqdm=False)  # warm-up (kernel build, xgrammar import, first compile)
t0, c0 = time.perf_counter(), time.process_time()
outs = llm.generate(prompts, ps, use_tqdm=False)
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
tokens = sum(len(o.outputs[0].token_ids) for o in outs)
result = {"seconds": dt, "cpu_seconds": cpu, "tokens": tokens, "tokens_per_s": tokens / dt,
          "tokens_per_cpu_s": tokens / cpu}
if mode == "json":
    from minengine.worker.structured_output import mask_profile
    so = ps[0].structured_outputs
    fills = [s.fill_seconds for o in outs[:8] for s in mask_profile(llm.llm_engine.structured_output_manager, so,
             o.outputs[0].token_ids).steps]
    result["mask_fill_us_median"] = statistics.median(fills) * 1e6 if fills else None
    result["complete"] = sum(o.outputs[0].finish_reason == "stop" for o in outs)
print(json.dumps(result))
""".replace("import json, sys, time", "import json, statistics, sys, time")


def run_child(tree: Path, mode: str, n: int, new: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(n), str(new)], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{tree} {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def export_revision(rev: str, dest: Path) -> Path:
    """The tree of ``rev`` in ``dest`` (git archive: the repository itself is not touched)."""
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=None, help="revision without the feature (default: merge base with main)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    base = args.base or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True,
                                       text=True, check=True).stdout.strip()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = export_revision(base, Path(tmp))
        runs: dict[str, list[float]] = {"base": [], "head": [], "json": []}
        json_extra = []
        for _ in range(args.repeats):  # alternate, so both see the same load
            runs["base"].append(run_child(base_tree, "plain", args.requests, args.new_tokens)["tokens_per_cpu_s"])
            runs["head"].append(run_child(ROOT, "plain", args.requests, args.new_tokens)["tokens_per_cpu_s"])
            r = run_child(ROOT, "json", args.requests, args.new_tokens)
            runs["json"].append(r["tokens_per_cpu_s"])
            json_extra.append(r)
    med = {k: statistics.median(v) for k, v in runs.items()}
    result = {
        "base": base, "repeats": args.repeats, "requests": args.requests, "new_tokens": args.new_tokens,
        "tokens_per_cpu_s": runs, "median_tokens_per_cpu_s": med,
        "head_over_base": med["head"] / med["base"], "json_over_head": med["json"] / med["head"],
        "mask_fill_us_median": statistics.median(r["mask_fill_us_median"] for r in json_extra),
        "json_complete": [r["complete"] for r in json_extra], "json_tokens": [r["tokens"] for r in json_extra],
        "load_average_before": load_before, "load_average_after": os.getloadavg(), "torch_threads": 1,
    }
    table = ("| run | median tokens per CPU second | runs |\n|---|---|---|\n"
             + "".join(f"| {k} | {med[k]:.1f} | {', '.join(f'{x:.1f}' for x in runs[k])} |\n" for k in runs)
             + f"\nunconstrained after / before: **{result['head_over_base']:.3f}**; JSON-constrained / unconstrained:"
               f" {result['json_over_head']:.3f}; median mask fill {result['mask_fill_us_median']:.1f} µs; "
               f"load average {load_before[0]:.1f} -> {result['load_average_after'][0]:.1f}\n")
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "structured_output.json").write_text(json.dumps(result, indent=1))
        (args.out / "structured_output.md").write_text(f"base {base}, {args.repeats} repeats\n\n" + table)
    return result


if __name__ == "__main__":
    main()

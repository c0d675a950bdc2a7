"""lm-evaluation-harness (``local-completions``) against ``python -m minengine serve``, on a small local task,
checked item by item against minengine's offline API.

Issue 24, part 1. Two tasks (``benchmarks/lm_eval_tasks/*.yaml``), built here from the held-out 10 % of Tiny
Shakespeare (``shared/data/text/tinyshakespeare.txt``: the bundled model was trained on the first 90 %), with a
fixed seed, into ``benchmarks/lm_eval_tasks/data/`` (nothing is downloaded):

- ``minengine_shakespeare_mc`` (multiple choice, lm-eval's loglikelihood requests: ``echo`` + ``logprobs`` +
  ``max_tokens`` 1): a speaker and the first two lines of a speech; the choices are its real third line and three
  lines of other speeches. Chance is 25 %.
- ``minengine_shakespeare_speaker`` (generate_until): two consecutive speeches; generate the next speaker's
  ``NAME:`` line (greedy, up to a newline); exact match.

The script starts ``minengine serve`` (bundled model, float32, CPU, ``--enable-tokenizer-info-endpoint``, so
lm-eval's ``tokenizer_backend=auto`` finds the remote tokenizer and tokenizes through ``/tokenize``), runs
``lm-eval run --model local-completions`` with ``--log_samples``, then recomputes every request offline
(``LLM.generate`` with ``prompt_logprobs``, lm-eval's context/continuation split; greedy generation with the
same stop) and reports lm-eval's scores, the offline scores, the largest loglikelihood difference and the number
of generations that differ. Needs ``pip install -r requirements-eval.txt`` (lm-eval is optional).

    python benchmarks/lm_eval_local.py             # about 2 minutes on 2 CPU cores
    python benchmarks/lm_eval_local.py --write     # also benchmarks/results/lm_eval_local.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import subprocess
import time
from pathlib import Path

from minengine import LLM, SamplingParams, TokensPrompt
from minengine.config import BUNDLED_MODEL
from minengine.entrypoints.server_process import ServerProcess
from minengine.workloads import find_data_dir

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "benchmarks" / "lm_eval_tasks"
RESULTS = ROOT / "benchmarks" / "results"
MC, SPEAKER = "minengine_shakespeare_mc", "minengine_shakespeare_speaker"
MODEL_NAME = "tiny-shakespeare-llama"
MAX_MODEL_LEN = 1024
SPEAKER_LINE = re.compile(r"^[A-Z][A-Za-z' ]*:$")


def speeches(text: str) -> list[tuple[str, list[str]]]:
    """(speaker, lines) of each speech: Tiny Shakespeare's blocks are separated by blank lines and start with
    a ``NAME:`` line."""
    out = []
    for block in text.split("\n\n"):
        lines = [line for line in block.strip("\n").split("\n") if line.strip()]
        if len(lines) >= 2 and SPEAKER_LINE.match(lines[0]):
            out.append((lines[0], lines[1:]))
    return out


def make_tasks(data_dir: Path, num_mc: int, num_speaker: int, seed: int) -> dict[str, list[dict]]:
    """The two tasks' documents, from the validation split (the last 10 % of the text, as the model's training
    script splits it) and written as JSON lines into ``benchmarks/lm_eval_tasks/data/``."""
    text = (data_dir / "text" / "tinyshakespeare.txt").read_text()
    held_out = text[int(len(text) * 0.9):]
    held_out = held_out[held_out.index("\n\n") + 2:]  # start at a speech boundary
    sp = speeches(held_out)
    rng = random.Random(seed)
    all_lines = [line for _, lines in sp for line in lines]
    mc = []
    for i in rng.sample([i for i, (_, lines) in enumerate(sp) if len(lines) >= 3], num_mc):
        speaker, lines = sp[i]
        others = [x for x in rng.sample(all_lines, 12) if x not in lines][:3]
        choices = [lines[2], *others]
        rng.shuffle(choices)
        mc.append({"context": f"{speaker}\n{lines[0]}\n{lines[1]}\n", "choices": choices,
                   "label": choices.index(lines[2])})
    speaker_docs = []
    candidates = [i for i in range(len(sp) - 2) if len(sp[i][1]) <= 6 and len(sp[i + 1][1]) <= 6]
    for i in rng.sample(candidates, num_speaker):
        ctx = "".join(f"{s}\n" + "".join(f"{line}\n" for line in lines) + "\n" for s, lines in sp[i:i + 2])
        speaker_docs.append({"context": ctx, "speaker": sp[i + 2][0]})
    docs = {MC: mc, SPEAKER: speaker_docs}
    (TASKS / "data").mkdir(exist_ok=True)
    for name, rows in docs.items():
        with open(TASKS / "data" / f"{name}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return docs


def start_server() -> ServerProcess:
    return ServerProcess([BUNDLED_MODEL, "--max-model-len", str(MAX_MODEL_LEN), "--enable-tokenizer-info-endpoint"],
                         timeout_s=180)


def lm_eval_command(port: int, out_dir: Path) -> list[str]:
    """The lm-eval command line (also printed, and in docs/server.md)."""
    return ["lm-eval", "run", "--model", "local-completions", "--model_args",
            f"model={MODEL_NAME},base_url=http://127.0.0.1:{port}/v1/completions,num_concurrent=1,"
            "max_retries=1,tokenized_requests=True,tokenizer_backend=auto",
            "--tasks", f"{MC},{SPEAKER}", "--include_path", ".", "--batch_size", "1",
            "--output_path", str(out_dir), "--log_samples", "--seed", "1234"]


def run_lm_eval(port: int, out_dir: Path) -> tuple[dict, dict[str, list[dict]], float]:
    """Run lm-eval (cwd = the tasks folder, so the yaml's data paths resolve); its results and samples."""
    cmd = lm_eval_command(port, out_dir)
    print("$ (cd benchmarks/lm_eval_tasks &&", " ".join(cmd) + ")", flush=True)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    subprocess.run(cmd, cwd=TASKS, env=env, check=True)
    wall = time.perf_counter() - start
    results_file = max(out_dir.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    results = json.loads(results_file.read_text())
    samples = {}
    for task in (MC, SPEAKER):
        path = max(out_dir.rglob(f"samples_{task}_*.jsonl"), key=lambda p: p.stat().st_mtime)
        samples[task] = sorted((json.loads(line) for line in path.read_text().splitlines()),
                               key=lambda s: s["doc_id"])
    return results, samples, wall


def encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair``: trailing whitespace of the context moves to the continuation; the whole is
    encoded and split at the context's length (no special tokens, as its remote tokenizer)."""
    n = len(context) - len(context.rstrip())
    if n:
        continuation, context = context[-n:] + continuation, context[:-n]
    whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    return ctx, whole[len(ctx):]


def offline(docs: dict[str, list[dict]]) -> dict:
    """Every request of both tasks through ``LLM`` in this process: loglikelihoods from ``prompt_logprobs``,
    greedy generations with lm-eval's stop."""
    llm = LLM(BUNDLED_MODEL, max_model_len=MAX_MODEL_LEN)
    tok = llm.get_tokenizer()
    prompts, spans = [], []
    for doc in docs[MC]:
        for choice in doc["choices"]:
            ctx, cont = encode_pair(tok, doc["context"], choice)
            prompts.append(TokensPrompt(prompt_token_ids=ctx + cont))
            spans.append((len(ctx), cont))
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0), use_tqdm=False)
    lls = [sum(out.prompt_logprobs[start + j][t].logprob for j, t in enumerate(cont))
           for out, (start, cont) in zip(outs, spans)]
    per_doc, k = [], 0
    for doc in docs[MC]:
        per_doc.append(lls[k:k + len(doc["choices"])])
        k += len(doc["choices"])
    acc = sum(max(range(len(ll)), key=ll.__getitem__) == d["label"] for ll, d in zip(per_doc, docs[MC]))
    acc_norm = sum(max(range(len(ll)), key=lambda i, ll=ll, d=d: ll[i] / len(d["choices"][i])) == d["label"]
                   for ll, d in zip(per_doc, docs[MC]))
    gens = llm.generate([d["context"] for d in docs[SPEAKER]],
                        SamplingParams(max_tokens=8, temperature=0, stop=["\n"], seed=1234), use_tqdm=False)
    texts = [g.outputs[0].text for g in gens]
    exact = sum(t == d["speaker"] for t, d in zip(texts, docs[SPEAKER]))
    return {"loglikelihoods": per_doc, "acc": acc / len(docs[MC]), "acc_norm": acc_norm / len(docs[MC]),
            "generations": texts, "exact_match": exact / len(docs[SPEAKER])}


def compare(results: dict, samples: dict, ref: dict) -> dict:
    mc = results["results"][MC]
    sp = results["results"][SPEAKER]
    served_lls = [[float(r[0][0]) for r in s["resps"]] for s in samples[MC]]  # lm-eval logs them as text
    max_diff = max(abs(a - b) for got, want in zip(served_lls, ref["loglikelihoods"]) for a, b in zip(got, want))
    served_gens = [s["resps"][0][0] for s in samples[SPEAKER]]
    differ = sum(a != b for a, b in zip(served_gens, ref["generations"]))
    return {
        "lm_eval": {"mc_acc": mc["acc,none"], "mc_acc_stderr": mc["acc_stderr,none"],
                    "mc_acc_norm": mc["acc_norm,none"], "speaker_exact_match": sp["exact_match,none"],
                    "speaker_exact_match_stderr": sp["exact_match_stderr,none"]},
        "offline": {"mc_acc": ref["acc"], "mc_acc_norm": ref["acc_norm"], "speaker_exact_match": ref["exact_match"]},
        "max_abs_loglikelihood_diff": max_diff, "num_loglikelihoods": sum(len(x) for x in served_lls),
        "generations_that_differ": differ, "num_generations": len(served_gens),
    }


def markdown(report: dict) -> str:
    le, off = report["lm_eval"], report["offline"]
    return "\n".join([
        f"lm-eval {report['lm_eval_version']} (`local-completions`) against `minengine serve` (bundled model, "
        f"float32, CPU), {report['date']}, {report['machine']}, load `{report['uptime']}`; lm-eval wall time "
        f"{report['lm_eval_wall_s']:.0f} s.",
        "",
        "| task | items | metric | lm-eval via the server | offline `LLM` |",
        "|---|---:|---|---:|---:|",
        f"| {MC} | {report['num_mc']} | acc (chance 0.25) | {le['mc_acc']:.3f} ± {le['mc_acc_stderr']:.3f} | "
        f"{off['mc_acc']:.3f} |",
        f"| {MC} | {report['num_mc']} | acc_norm | {le['mc_acc_norm']:.3f} | {off['mc_acc_norm']:.3f} |",
        f"| {SPEAKER} | {report['num_speaker']} | exact_match | {le['speaker_exact_match']:.3f} ± "
        f"{le['speaker_exact_match_stderr']:.3f} | {off['speaker_exact_match']:.3f} |",
        "",
        f"Largest |loglikelihood difference| over {report['num_loglikelihoods']} requests: "
        f"{report['max_abs_loglikelihood_diff']:.2e} nats; generations that differ: "
        f"{report['generations_that_differ']} of {report['num_generations']}.",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-mc", type=int, default=60)
    ap.add_argument("--num-speaker", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None, help="the shared/data folder (None: $MINENGINE_DATA or ../shared/data)")
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/lm_eval_local.{json,md}")
    a = ap.parse_args()
    import lm_eval  # fail early with the install hint

    data_dir = find_data_dir(a.data_dir)
    if data_dir is None or not (data_dir / "text" / "tinyshakespeare.txt").is_file():
        ap.error("no shared/data/text/tinyshakespeare.txt: pass --data-dir or set MINENGINE_DATA")
    docs = make_tasks(data_dir, a.num_mc, a.num_speaker, a.seed)
    server = start_server()
    port = server.port
    try:
        results, samples, wall = run_lm_eval(port, RESULTS / "lm_eval_run")
    finally:
        server.stop(timeout_s=60)
    report = compare(results, samples, offline(docs))
    report.update(lm_eval_version=getattr(lm_eval, "__version__", "0.4.13"), num_mc=a.num_mc,
                  num_speaker=a.num_speaker, seed=a.seed, lm_eval_wall_s=wall, date=time.strftime("%Y-%m-%d"),
                  machine=f"{platform.machine()}, {os.cpu_count()} CPUs",
                  uptime=subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
                  command="(cd benchmarks/lm_eval_tasks && " + " ".join(lm_eval_command(port, RESULTS / "lm_eval_run"))
                  + ")")
    text = markdown(report)
    print(text)
    if a.write:
        (RESULTS / "lm_eval_local.json").write_text(json.dumps(report, indent=2) + "\n")
        (RESULTS / "lm_eval_local.md").write_text(text + "\n")


if __name__ == "__main__":
    main()

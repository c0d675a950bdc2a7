"""benchmarks/fleet.py's plumbing: README parts from separate runs, runs shared between processes, the tail note;
and ``reusable_prefix_tokens`` / ``reuse_gaps`` (each request's share of the infinite-cache ideal, and how long
its prefix had gone unused)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import pickle
import random
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine.fleet import infinite_cache_hits, reusable_prefix_tokens, reuse_gaps
from minengine.workloads import TraceRequest


def bench():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "fleet.py"
    spec = importlib.util.spec_from_file_location("fleet_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_parts_of_separate_runs_sit_side_by_side(tmp_path):
    mod = bench()
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{mod.README_BEGIN}\nhand-written lead\n{mod.README_END}\nafter\n")
    mod.update_readme(readme, "store v1", "store")
    mod.update_readme(readme, "speed v1", "speed,routers")
    section = mod.update_readme(readme, "store v2", "store")  # a later run of the same part replaces only it
    text = readme.read_text()
    assert "store v1" not in text and text.count("store v2") == 1 and "speed v1" in text
    assert text.index("hand-written lead") < text.index("store v2") < text.index("speed v1")
    assert text.startswith("# x\n") and text.endswith(f"{mod.README_END}\nafter\n")
    assert section == text.split(mod.README_BEGIN + "\n", 1)[1].split("\n" + mod.README_END, 1)[0]
    mod.update_readme(readme, "everything", None)  # a run of every section replaces the whole section
    assert readme.read_text() == f"# x\n{mod.README_BEGIN}\neverything\n{mod.README_END}\nafter\n"
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="fleet:begin"):
        mod.update_readme(readme, "x", "store")


def _square(key):
    return key[0] * key[0]


def _share(args):
    cache, plan, log = args

    def run(key):  # leaves one file per run, so a run made twice shows
        (Path(log) / f"{key[0]}-{os.getpid()}").touch()
        time.sleep(0.2)  # long enough for the other process to reach the same run
        return _square(key)

    return bench().shared_runs(cache, plan, run, settings=("s",))


def test_shared_runs_split_between_processes_and_reuse_results(tmp_path):
    mod = bench()
    plan = [(i, "x") for i in range(6)]
    want = {k: k[0] ** 2 for k in plan}
    assert mod.shared_runs(None, plan, _square, settings=("s",)) == want
    cache = str(tmp_path / "cache")
    log = tmp_path / "ran"
    log.mkdir()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        got = pool.map(_share, [(cache, plan, str(log))] * 2, chunksize=1)
    assert got == [want, want]
    assert sorted(int(f.name.split("-")[0]) for f in log.iterdir()) == list(range(6))  # each run made once
    assert len(list(Path(cache).glob("*.claim"))) == len(plan) == len(list(Path(cache).glob("*.pkl")))

    def boom(key):
        raise AssertionError("ran again")

    assert mod.shared_runs(cache, plan, boom, settings=("s",)) == want  # same settings: reused
    assert mod.shared_runs(cache, plan[:1], _square, settings=("t",)) == {plan[0]: 0}  # other settings: run anew
    assert pickle.loads(next(Path(cache).glob("*-0-x.pkl")).read_bytes()) == 0


def _trace(rows: list[tuple[int, int]]) -> list[TraceRequest]:
    """Requests whose prompts are ``family`` blocks of 16 shared tokens then ``own`` distinct ones."""
    out = []
    for i, (family, own) in enumerate(rows):
        ids = [7 + family] * 16 * 3 + [10_000 + i * 1000 + k for k in range(own)]
        out.append(TraceRequest(float(i), len(ids), 4, ids, f"r{i}"))
    return out


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40)), min_size=1, max_size=12),
       st.sampled_from([None, 40, 64]))
def test_reusable_prefix_tokens_add_up_to_the_ideal(rows, limit):
    trace = _trace(rows)
    per = reusable_prefix_tokens(trace, 16, limit)
    assert set(per) == {r.request_id for r in trace}
    assert sum(per.values()) == infinite_cache_hits(trace, 16, limit).hit_tokens
    gaps = reuse_gaps(trace, 16, limit)
    last = {}
    for (family, _), r in zip(rows, trace):  # the first of a family has nothing reusable, later ones its head
        plen = min(r.prompt_len, limit - r.output_len) if limit else r.prompt_len
        assert per[r.request_id] == (0 if family not in last else min(3, (plen - 1) // 16) * 16)
        assert gaps[r.request_id] == (None if family not in last else r.arrival_time - last[family])
        last[family] = r.arrival_time


def test_tail_note_names_what_no_cache_serves():
    mod = bench()
    rng = random.Random(0)

    class Metrics:
        def __init__(self, i, prompt, ttft):
            self.num_prompt_tokens, self.num_cached_tokens, self.ttft, self.time_in_queue = prompt, 0, ttft, 0.0
            self.arrival_time, self.finished_time = float(i), i + 10.0

    class Store:  # 100 blocks of 1 GB in all, 1.09 TB written over the 109 s run: it turns over in about 10 s
        num_nodes, dram_capacity_blocks, ssd_capacity_blocks, block_bytes, written_bytes = 1, 60, 40, 1e9, 1.09e12
        declined_loads, wasted_blocks, loaded_blocks = 0, 3, 50

    class Run:
        request_metrics = {f"r{i}": Metrics(i, 1000, 0.1 + rng.random() * 0.01) for i in range(99)}
        request_metrics["long"] = Metrics(99, 60_000, 0.0)
        store = None

        def latency(self, metric, q):
            return sorted(m.ttft for m in self.request_metrics.values())[-1]

    class A:
        hardware, model, tp = "h100", "llama-3-8b", 1

    run = Run()
    run.request_metrics["long"].ttft = mod.prefill_alone_s(mod.StepCostModel("h100", "llama-3-8b"), 60_000, 0)
    reusable = dict.fromkeys(run.request_metrics, 0)
    note = mod.tail_note(run, "x", reusable, A())
    assert "1 requests at or above" in note and "1 of them have no reusable prefix" in note
    assert "100% of their TTFT" in note and "the store cannot shorten" in note
    reusable["long"] = 50_000  # reusable, not served: no longer "no cache holds"; with a store, was it evicted?
    assert "cannot shorten" not in mod.tail_note(run, "x", reusable, A())
    run.store = Store()
    for gap, evicted in ((30.0, 1), (5.0, 0)):
        note = mod.tail_note(run, "x", reusable, A(), gaps={"long": gap})
        assert "turn over in about 10 s" in note and f"median {gap:.0f} s" in note
        assert f"and {evicted} of these gaps are longer" in note and "no longer held it" in note
    run.store.declined_loads = 2
    assert "declined 2 loads" in mod.tail_note(run, "x", reusable, A(), gaps={"long": 5.0})

"""Chapter 10's exercises check themselves: typical wrong answers FAIL and the reference solution PASSes.

The chapter runs once (``MINENGINE_FAST=1``, nbclient) with its solutions filled in; after every check cell the test
inserts one cell per typical mistake that sets the answer to that mistake and runs the same check. Each of those must
print FAIL (and no PASS); the original check cells must print PASS. The mistakes are the ones a learner makes: K
without V, bits read as bytes, seconds for milliseconds; max over min instead of over the mean; the wrong router;
goodput not per GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

from tests.test_notebooks import NOTEBOOKS_DIR, exercises, load, output_text, with_solutions  # noqa: E402

WRONG_ANSWERS = {
    "answer_1": [  # K only; bits read as bytes; seconds; one layer; bytes read as bits
        "2000 * LLAMA_3_8B.kv_bytes_per_token / 2 / 12.5e9 * 1000",
        "2000 * LLAMA_3_8B.kv_bytes_per_token / 100e9 * 1000",
        "2000 * LLAMA_3_8B.kv_bytes_per_token / 12.5e9",
        "2000 * LLAMA_3_8B.kv_bytes_per_token / LLAMA_3_8B.num_layers / 12.5e9 * 1000",
        "2000 * LLAMA_3_8B.kv_bytes_per_token * 8 / 12.5e9 * 1000",
    ],
    "answer_2": [  # max over min; mean over max; a difference
        "max(r.busy_time_s for r in fleet.replicas) / min(r.busy_time_s for r in fleet.replicas)",
        "sum(r.busy_time_s for r in fleet.replicas) / len(fleet.replicas) / max(r.busy_time_s for r in fleet.replicas)",
        "max(r.busy_time_s for r in fleet.replicas) - min(r.busy_time_s for r in fleet.replicas)",
    ],
    "answer_3": [  # the worst router; another one; the name misspelt
        "min(routers, key=lambda name: routers[name].prefix_hit_rate)",
        "[n for n in routers if n != max(routers, key=lambda name: routers[name].prefix_hit_rate)][0]",
        "max(routers, key=lambda name: routers[name].prefix_hit_rate).replace('-', ' ')",
    ],
    "answer_4": [  # not per GPU; forgot the base rate; per prefill GPU
        'goodputs["tight TPOT", "disaggregated 2:2"].goodput',
        'goodputs["tight TPOT", "disaggregated 2:2"].multiplier / 4',
        'goodputs["tight TPOT", "disaggregated 2:2"].goodput / 2',
    ],
}


def test_wrong_answers_fail_and_the_solution_passes(monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("MINENGINE_FAST", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    nb = with_solutions(load("10_fleet"))
    found = exercises(nb)
    assert len(found) == len(WRONG_ANSWERS)
    for _, check, _ in reversed(found):  # from the last, so earlier indices stay valid
        variable = next(v for v in WRONG_ANSWERS if v in nb.cells[check].source)
        cells = [nbformat.v4.new_code_cell(f"{variable} = {wrong}\n{nb.cells[check].source}")
                 for wrong in WRONG_ANSWERS[variable]]
        for cell in cells:
            cell.metadata["tags"] = ["wrong-answer"]
        nb.cells[check + 1:check + 1] = cells
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]
    assert not errors, [e.get("ename") + ": " + e.get("evalue", "") for e in errors]
    passes = fails = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        text = "".join(output_text(o) for o in cell.outputs)
        if "wrong-answer" in cell.metadata.get("tags", []):
            assert "FAIL" in text and "PASS" not in text, f"a wrong answer passed: {cell.source.splitlines()[0]!r}"
            fails += 1
        elif "check" in cell.metadata.get("tags", []):
            assert "PASS" in text and "FAIL" not in text, f"the solution failed: {text!r}"
            passes += 1
    assert passes == len(WRONG_ANSWERS) and fails == sum(map(len, WRONG_ANSWERS.values()))
    assert Path(NOTEBOOKS_DIR / "10_fleet.ipynb").exists()

"""The learner's parts reach every surface: the server (``--lab NAME=PATH``), the dashboard's runner (which says
whose parts ran) and the command line's engine flags."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minengine.__main__ import _config, build_parser
from minengine.labs.solutions import block_pool as reference_pool
from minengine.viz.runner import DashboardConfig, parse_labs, run_workload
from minengine.viz.workload import Workload, WorkloadRequest
from tests.server_helpers import running_server

POOL = "minengine.labs.solutions.block_pool"


def test_lab_flags_build_the_labs_setting():
    a = build_parser().parse_args(["serve", "--lab", f"block_pool={POOL}", "--lab", "prefix_cache=mine.py"])
    assert _config(a).labs == {"block_pool": POOL, "prefix_cache": "mine.py"}
    assert _config(build_parser().parse_args(["run"])).labs is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--lab", "block_pool"])


def test_the_server_runs_on_the_learners_part(bundled_model):
    with running_server(bundled_model, labs={"block_pool": POOL}, num_kv_blocks=32) as server:
        assert type(server.engine.kv_cache_manager.pool) is reference_pool.BlockPool
        reply = httpx.post(server.url + "/v1/completions", json={"model": server.engine.config.served_model_name,
                                                                 "prompt": "ROMEO:", "max_tokens": 4}, timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4


def test_the_dashboard_says_which_parts_are_the_learners():
    workload = Workload("tiny", (WorkloadRequest("r0", (1, 2, 3, 4, 5), 3, 0.0),))
    res = run_workload(DashboardConfig(num_kv_blocks=16, labs=(("block_pool", POOL),)), workload)
    assert res.parts == f"learner's parts: the KV block pool (minengine/core/block_pool.py) <- {POOL}"
    assert run_workload(DashboardConfig(num_kv_blocks=16), workload).parts == ""


@given(st.lists(st.tuples(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), st.from_regex(r"[\w./]{1,12}",
                                                                                     fullmatch=True)), max_size=3))
def test_parse_labs_reads_what_it_is_given(pairs):
    assert parse_labs(",".join(f"{n}={p}" for n, p in pairs)) == tuple(pairs)


@pytest.mark.parametrize("text", ["block_pool", "=x.py", "block_pool=", "a=b,c"])
def test_parse_labs_refuses_an_entry_without_name_and_path(text):
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_labs(text)


@pytest.mark.parametrize("command", ["serve", "run", "generate"])
@pytest.mark.parametrize("lab, words", [("nope=x.py", "labs has unknown lab 'nope'; the labs are block_pool"),
                                        ("block_pool=missing.py", "missing.py' does not exist")])
def test_a_bad_lab_flag_is_an_error_before_the_model_loads(command, lab, words, capsys):
    from minengine.__main__ import main

    argv = [command, *(["ROMEO:"] if command == "generate" else []), "--lab", lab]
    with pytest.raises(SystemExit) as exit_code:
        main(argv)
    assert exit_code.value.code == 2 and words in capsys.readouterr().err

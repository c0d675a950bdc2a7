"""How tensor-parallel workers start (``executor/start_method.py``): forked by default, as vLLM, so a script with no
``if __name__ == "__main__":`` guard (vLLM's basic example) runs with ``tensor_parallel_size=2``; spawned where
``VLLM_WORKER_MULTIPROC_METHOD`` / ``MINENGINE_WORKER_MULTIPROC_METHOD`` or CUDA say so, and then an unguarded
script gets ``MainGuardError`` naming the guard before any process starts.

The scripts run as subprocesses (the main module is what matters). The fork test runs a TP 1 engine in the parent
first, with 2 torch threads and text prompts, so the fork happens after torch's OpenMP pool and the tokenizer ran;
then it kills the driver with SIGKILL and checks that both workers exit (a forked worker must not hold the
driver's pipe ends).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine.executor.start_method import (
    ENV_NAMES,
    MainGuardError,
    check_main_guard,
    line_is_guarded,
    spawned_workers_unless_set,
    worker_start_method,
)

ROOT = Path(__file__).resolve().parents[2]

UNGUARDED = """
import json, os, signal, sys
import torch
from minengine import LLM, SamplingParams

torch.set_num_threads(2)
prompts = ["ROMEO:", "JULIET:\\nO Romeo, Romeo!", "KING RICHARD III:\\nNow is the winter"]
params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
tokens = {}
if sys.argv[1] == "both":
    llm = LLM(model=MODEL, max_model_len=256)
    tokens["tp1"] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    del llm
llm = LLM(model=MODEL, tensor_parallel_size=2, max_model_len=256)
tokens["tp2"] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
tokens["start_method"] = llm.llm_engine.runner.start_method
tokens["workers"] = llm.llm_engine.runner.worker_pids
print("RESULT " + json.dumps(tokens), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the driver dies: its forked workers must see it and exit
"""


def _run_script(tmp_path, bundled_model, method: str | None, mode: str, timeout: float = 300,
                guarded: bool = False):
    script = tmp_path / ("guarded.py" if guarded else "unguarded.py")
    body = textwrap.indent(UNGUARDED, "    ") if guarded else UNGUARDED
    script.write_text(f"MODEL = {bundled_model!r}\n" + ("if __name__ == '__main__':\n" if guarded else "") + body)
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES and k != "TOKENIZERS_PARALLELISM"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if method is not None:
        env["MINENGINE_WORKER_MULTIPROC_METHOD"] = method
    # files, not pipes: a worker that outlived the driver would hold a pipe open and hang the wait for its end
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        code = subprocess.run([sys.executable, str(script), mode], stdout=out, stderr=err, env=env, timeout=timeout,
                              cwd=tmp_path).returncode
    return subprocess.CompletedProcess(script, code, (tmp_path / "out.txt").read_text(),
                                       (tmp_path / "err.txt").read_text())


@pytest.mark.parametrize("method, guarded", [(None, False), ("spawn", True)], ids=["fork-unguarded",
                                                                                    "spawn-guarded"])
def test_tp2_gives_tp1s_tokens_and_workers_follow_the_driver(tmp_path, bundled_model, method, guarded):
    """The default (fork) from an unguarded script, and spawn from a guarded one (as serve and CUDA start them)."""
    proc = _run_script(tmp_path, bundled_model, method, "both", guarded=guarded)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no result (exit code {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    result = json.loads(lines[0][len("RESULT "):])
    assert result["start_method"] == (method or "fork")
    assert result["tp2"] == result["tp1"] and all(len(t) == 8 for t in result["tp1"])
    assert "WorkerFailedError" not in proc.stderr and "bootstrapping phase" not in proc.stderr
    assert "The current process just got forked" not in proc.stderr  # TOKENIZERS_PARALLELISM was set first
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(pid) for pid in result["workers"]):
        time.sleep(0.2)
    left = [pid for pid in result["workers"] if _alive(pid)]
    for pid in left:
        psutil.Process(pid).kill()
    assert not left, "a forked worker outlived its killed driver"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_spawn_with_unguarded_script_names_the_missing_guard(tmp_path, bundled_model):
    proc = _run_script(tmp_path, bundled_model, "spawn", "tp2", timeout=300)
    assert proc.returncode != 0
    assert "MainGuardError" in proc.stderr and 'if __name__ == "__main__":' in proc.stderr
    source = (tmp_path / "unguarded.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "tensor_parallel_size=2" in text)
    assert "unguarded.py" in proc.stderr and f"its line {line} " in proc.stderr  # the line that starts workers
    assert "MINENGINE_WORKER_MULTIPROC_METHOD=spawn" in proc.stderr
    assert "WorkerFailedError" not in proc.stderr and "bootstrapping phase" not in proc.stderr
    assert "RESULT" not in proc.stdout
    assert "in check_main_guard" in proc.stderr  # raised by the check, before the store or any process existed


def test_guarded_call_under_spawn_passes_the_check(tmp_path):
    """The same check from inside a guard and from an unguarded line of a main script, without starting workers."""
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""
        import sys
        from minengine.executor.start_method import MainGuardError, check_main_guard

        def start():
            check_main_guard("spawn", "test")

        if __name__ == "__main__":
            start()
            print("guarded ok")
        try:
            start()
        except MainGuardError as exc:
            print("unguarded refused:", "its line 12 " in str(exc))  # the start() under try
        check_main_guard("fork", "test")
        print("fork ok")
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split("\n")[:3] == ["guarded ok", "unguarded refused: True", "fork ok"], out.stderr


def test_pytest_itself_is_not_an_unguarded_script():
    check_main_guard("spawn", "test")  # pytest's own main module calls this test from under its guard


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["plain", "guarded", "reversed", "else", "nested", "elif"]), min_size=1,
                max_size=8))
def test_line_is_guarded_matches_the_scripts_structure(kinds):
    """Any script of top-level blocks: a line is guarded exactly when it lies in the body of a
    ``__name__ == "__main__"`` test (either order, nested or an elif; never its else)."""
    lines, expected = [], {}
    for i, kind in enumerate(kinds):
        if kind == "plain":
            body, guarded = [f"x{i} = {i}"], [False]
        elif kind == "guarded":
            body, guarded = ["if __name__ == '__main__':", f"    x{i} = {i}"], [True, True]
        elif kind == "reversed":
            body, guarded = ["if '__main__' == __name__:", f"    x{i} = {i}"], [True, True]
        elif kind == "else":
            body, guarded = ["if __name__ == '__main__':", "    pass", "else:", f"    x{i} = {i}"], \
                [True, True, False, False]
        elif kind == "nested":
            body, guarded = ["try:", "    if __name__ == '__main__':", f"        x{i} = {i}", "finally:",
                             "    pass"], [False, True, True, False, False]
        else:
            body, guarded = ["if x:", "    pass", "elif __name__ == '__main__':", f"    x{i} = {i}"], \
                [False, False, True, True]
        for text, g in zip(body, guarded):
            lines.append(text)
            if text.strip().startswith(("x", "pass")):  # statements (a test line itself is not run by the guard)
                expected[len(lines)] = g
    tree = ast.parse("\n".join(lines))
    for line, g in expected.items():
        assert line_is_guarded(tree, line) == g, (line, "\n".join(lines))


def test_start_method_env_vars(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    assert worker_start_method()[0] == "fork"
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    assert worker_start_method() == ("spawn", "VLLM_WORKER_MULTIPROC_METHOD=spawn")
    monkeypatch.setenv("MINENGINE_WORKER_MULTIPROC_METHOD", "fork")  # the project's name wins
    assert worker_start_method() == ("fork", "MINENGINE_WORKER_MULTIPROC_METHOD=fork")
    monkeypatch.setenv("MINENGINE_WORKER_MULTIPROC_METHOD", "thread")
    with pytest.raises(ValueError, match="MINENGINE_WORKER_MULTIPROC_METHOD='thread'.*fork, spawn, forkserver"):
        worker_start_method()


def test_cuda_initialised_means_spawn(monkeypatch):
    import torch

    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    method, reason = worker_start_method()
    assert method == "spawn" and "CUDA" in reason


def test_serve_spawns_unless_told_and_restores_the_environment(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    with spawned_workers_unless_set():
        assert worker_start_method()[0] == "spawn"
    assert all(name not in os.environ for name in ENV_NAMES)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    with spawned_workers_unless_set():
        assert worker_start_method()[0] == "fork"
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


def test_main_guard_error_is_a_runtime_error():
    assert issubclass(MainGuardError, RuntimeError)


@pytest.mark.parametrize("settled", [False, True])
def test_a_forked_child_restarts_an_unsettled_kernel_start(monkeypatch, settled):
    """A build under way in the parent ran in a thread the fork does not copy: the child starts over; a settled
    kernel (its library loaded in the copied memory) is kept."""
    from minengine.layers import cpu_attention as ca

    loader = ca.KernelLoader()
    state = ca.KernelState.READY if settled else ca.KernelState.BUILDING
    loader._status, loader.op = ca.KernelStatus(state), (print if settled else None)
    monkeypatch.setattr(ca, "_PROCESS", loader)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once, whatever happens (it is a copy of this test process)
        try:
            child = ca._PROCESS
            os.write(write, f"{child is not loader} {child.status().state.name} {child.op is print}".encode())
        finally:
            os._exit(0)
    os.close(write)
    report = os.read(read, 200).decode()
    os.waitpid(pid, 0)
    assert report == ("True READY True" if settled else "True NOT_STARTED False")


def test_workers_fork_before_the_store_has_a_thread(bundled_model, monkeypatch):
    """The rendezvous store runs a thread that serves the first workers' connections; a worker forked while that
    thread held a lock would wait on it forever (a fork copies only the forking thread). So every worker starts
    before the store exists and receives its config, with the store's port, over its pipe."""
    import multiprocessing

    import torch.distributed as dist

    from minengine import LLM, SamplingParams

    workers_at_store = []
    real_store = dist.TCPStore

    def store(*args, **kwargs):
        workers_at_store.append(sum(p.name.startswith("minengine-worker") for p in multiprocessing.active_children()))
        return real_store(*args, **kwargs)

    monkeypatch.setenv("MINENGINE_WORKER_MULTIPROC_METHOD", "fork")
    monkeypatch.setattr(dist, "TCPStore", store)
    llm = LLM(bundled_model, tensor_parallel_size=2, max_model_len=128, num_kv_blocks=32,
              allow_cpu_oversubscription=True)
    try:
        out = llm.generate(["ROMEO:"], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 2
    finally:
        llm.llm_engine.shutdown()
    assert workers_at_store == [2]

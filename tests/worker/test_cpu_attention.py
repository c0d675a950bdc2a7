"""minengine's C++ CPU paged-attention kernel (layers/cpu_attention.cpp): its numbers against a float64 reference on
random block tables, its build (cache keys per CPU, source and environment; lock; a dead build's leftovers; no
compiler), the start that never waits long for a build (background builder, torch path meanwhile, a stuck foreign
build, the switch to the kernel mid-run) and the switch that turns it off.

The engine-level checks (greedy tokens equal to transformers with the kernel on and off) are in
tests/equivalence/test_equivalence_hf.py; test_attention_paths.py runs the whole step plan through both paths."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine.layers import cpu_attention, cpu_kernel_build

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None or shutil.which("ninja") is None,
                                    reason="no C++ compiler or ninja: the kernel cannot be built here")


@pytest.fixture(scope="module")
def kernel():
    if shutil.which("c++") is None or shutil.which("ninja") is None:
        pytest.skip("no C++ compiler or ninja: the kernel cannot be built here")
    op = cpu_attention.build()
    assert op is not None, "the kernel failed to build or failed its self-check (see the warning above)"
    return op


def random_problem(seed: int, n: int, q_len: int, kv_heads: int, group: int, head_dim: int, block_size: int,
                   max_context: int, dtype: torch.dtype):
    """n requests with random contexts (plus q_len new tokens each), blocks scattered over a shuffled pool;
    unused slots hold a huge value, so a key read past a request's length would wreck its row."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [int(torch.randint(0, max_context + 1, (1,), generator=gen)) + q_len for _ in range(n)]
    blocks = [-(-s // block_size) for s in seq_lens]
    width = max(blocks)
    pool = sum(blocks) + 3
    perm = torch.randperm(pool, generator=gen)
    tables = torch.zeros(n, width, dtype=torch.int64)
    at = 0
    for i, b in enumerate(blocks):
        tables[i, :b] = perm[at:at + b]
        at += b
    k_cache = torch.full((pool, block_size, kv_heads, head_dim), 1e4)
    v_cache = torch.full_like(k_cache, 1e4)
    for i, s in enumerate(seq_lens):
        for p in range(s):
            k_cache[tables[i, p // block_size], p % block_size] = torch.randn(kv_heads, head_dim, generator=gen)
            v_cache[tables[i, p // block_size], p % block_size] = torch.randn(kv_heads, head_dim, generator=gen)
    query = torch.randn(n * q_len, kv_heads * group, head_dim, generator=gen)
    return (query.to(dtype), k_cache.to(dtype), v_cache.to(dtype), tables,
            torch.tensor(seq_lens, dtype=torch.int32))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 6), q_len=st.sampled_from([1, 1, 2, 3, 5, 16]),
       kv_heads=st.integers(1, 3), group=st.sampled_from([1, 2, 3, 4, 8]), head_dim=st.sampled_from([8, 32, 40, 64]),
       block_size=st.sampled_from([1, 4, 16]), max_context=st.sampled_from([0, 7, 60]))
def test_kernel_matches_float64_reference(kernel, seed, n, q_len, kv_heads, group, head_dim, block_size,
                                          max_context):
    """Property: for any block layout, context length (0 included: a chunk that only sees itself), q_len, GQA
    group and head_dim the kernel supports, each row equals causal softmax attention over its own keys."""
    query, k_cache, v_cache, tables, seq_lens = random_problem(seed, n, q_len, kv_heads, group, head_dim,
                                                               block_size, max_context, torch.float32)
    out = torch.empty_like(query)
    kernel(out, query, k_cache, v_cache, tables, seq_lens, q_len, head_dim ** -0.5, 1)
    ref = cpu_attention.reference_attention(query, k_cache, v_cache, tables, seq_lens, q_len, head_dim ** -0.5)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5)


def test_kernel_bfloat16_and_two_threads(kernel):
    """bfloat16 caches (read as float32, output rounded once) and the OpenMP path agree with the reference."""
    for dtype, threads, tol in ((torch.bfloat16, 1, 2e-2), (torch.float32, 2, 2e-5)):
        query, k_cache, v_cache, tables, seq_lens = random_problem(3, 9, 1, 2, 4, 64, 16, 200, dtype)
        out = torch.empty_like(query)
        kernel(out, query, k_cache, v_cache, tables, seq_lens, 1, 0.125, threads)
        ref = cpu_attention.reference_attention(query, k_cache, v_cache, tables, seq_lens, 1, 0.125)
        torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


def test_kernel_rejects_what_it_cannot_do(kernel):
    query, k_cache, v_cache, tables, seq_lens = random_problem(0, 2, 1, 2, 2, 32, 4, 10, torch.float32)
    out = torch.empty_like(query)
    with pytest.raises(RuntimeError, match="seq_lens must be int32"):
        kernel(out, query, k_cache, v_cache, tables, seq_lens.long(), 1, 0.1, 1)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernel(out.double(), query.double(), k_cache.double(), v_cache.double(), tables, seq_lens, 1, 0.1, 1)
    # kernel_for sends what the kernel does not take to the torch path
    assert cpu_attention.kernel_for(torch.zeros(1, 2, 12), torch.zeros(1, 4, 2, 12)) is None  # head_dim 12
    assert cpu_attention.kernel_for(query.half(), k_cache.half()) is None


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 4), q_len=st.sampled_from([1, 2, 5]),
       block_size=st.sampled_from([1, 4, 16]), fault=st.sampled_from(["past-pool", "negative", "short-row",
                                                                      "seq-below-q", "no-columns"]))
def test_kernel_refuses_to_read_outside_its_tensors(kernel, seed, n, q_len, block_size, fault):
    """Property: the kernel reads through the block tables unchecked, so the binding checks, per request, the
    entries it will read: a block id outside the pool, a seq_len past the row's blocks, a seq_len below q_len,
    a table without columns. Each is a RuntimeError naming the request, never a segfault or a silent NaN. Table
    entries past a request's own blocks are never read, so garbage there (-1 here) is allowed."""
    gen = torch.Generator().manual_seed(seed)
    query, k_cache, v_cache, tables, seq_lens = random_problem(seed, n, q_len, 2, 2, 32, block_size, 40,
                                                               torch.float32)
    needed = [-(-s // block_size) for s in seq_lens.tolist()]
    padded = torch.cat([tables, torch.zeros(n, 2, dtype=torch.int64)], 1)
    for i, b in enumerate(needed):
        padded[i, b:] = -1  # never read: must not be refused
    out = torch.empty_like(query)
    kernel(out, query, k_cache, v_cache, padded, seq_lens, q_len, 0.1, 1)
    torch.testing.assert_close(out.double(), cpu_attention.reference_attention(
        query, k_cache, v_cache, tables, seq_lens, q_len, 0.1), atol=2e-5, rtol=2e-5)
    victim = int(torch.randint(0, n, (1,), generator=gen))
    bad_tables, bad_lens = padded.clone(), seq_lens.clone()
    entry = int(torch.randint(0, needed[victim], (1,), generator=gen))
    if fault == "past-pool":
        bad_tables[victim, entry] = k_cache.shape[0] + int(torch.randint(0, 3, (1,), generator=gen))
        match = "outside the pool"
    elif fault == "negative":
        bad_tables[victim, entry] = -1
        match = "outside the pool"
    elif fault == "short-row":
        bad_lens[victim] = padded.shape[1] * block_size + 1
        match = "blocks, its block table has"
    elif fault == "seq-below-q":
        bad_lens[victim] = q_len - 1
        match = "less than q_len"
    else:
        bad_tables = torch.zeros(n, 0, dtype=torch.int64)
        match = "its block table has 0"
    with pytest.raises(RuntimeError, match=match):
        kernel(out, query, k_cache, v_cache, bad_tables, bad_lens, q_len, 0.1, 1)


def test_switch_turns_the_kernel_off(kernel, monkeypatch):
    query, k_cache = torch.zeros(1, 2, 32), torch.zeros(1, 4, 2, 32)
    assert cpu_attention.kernel_for(query, k_cache) is not None
    for value in ("0", "off", "False", "no"):
        monkeypatch.setenv(cpu_attention.ENV_SWITCH, value)
        assert cpu_attention.kernel_for(query, k_cache) is None


def test_each_version_of_the_source_builds_under_its_own_name(monkeypatch, tmp_path):
    """Checkouts of different kernel versions sharing one cache (a home directory, CI) must not rebuild over each
    other on every switch: the name carries the source's hash (and the CPU's)."""
    before = cpu_attention.default_name()
    assert before == cpu_attention.default_name()
    assert before.startswith(f"minengine_cpu_attention_{cpu_attention.machine_tag()}_")
    changed = tmp_path / "cpu_attention.cpp"
    changed.write_text(cpu_attention.SOURCE.read_text() + "\n// another version\n")
    monkeypatch.setattr(cpu_kernel_build, "SOURCE", changed)  # what the build hashes
    assert cpu_attention.default_name() != before


def test_each_environment_builds_under_its_own_name(monkeypatch, tmp_path):
    """Virtualenvs with their own torch, or another compiler, make another build command (other include and
    library paths): each gets its own name, so they never rebuild over each other; the same
    environment always gets the same name, and ``c++`` resolves to the compiler it links to."""
    before = cpu_attention.default_name()
    assert cpu_attention.environment_tag() == cpu_attention.environment_tag()
    assert before.endswith("_" + cpu_attention.environment_tag())
    other_torch = tmp_path / "venv" / "site-packages" / "torch"
    other_torch.mkdir(parents=True)
    monkeypatch.setattr(torch, "__file__", str(other_torch / "__init__.py"))
    assert cpu_attention.default_name() != before
    monkeypatch.undo()
    if shutil.which("c++"):
        monkeypatch.setenv("CXX", os.path.realpath(shutil.which("c++")))
        assert cpu_attention.default_name() == before  # the same compiler under its real name
    wrapper = second_compiler(tmp_path)
    monkeypatch.setenv("CXX", str(wrapper))
    assert cpu_attention.default_name() != before


def second_compiler(tmp_path) -> Path:
    """A compiler of a second environment: a script that runs the system's ``c++`` from its own path (named g++,
    which torch's builder accepts by name)."""
    wrapper = tmp_path / "second-env" / "g++"
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("c++") or "c++"} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_status_says_each_state_in_words():
    """The public status: each state's ``message``, the line the CLI prints and the dashboard shows."""
    S, K = cpu_attention.KernelStatus, cpu_attention.KernelState
    building = S(K.BUILDING, seconds=104.4).message
    assert building.startswith("compiling the CPU attention kernel (104 s so far") and "~" not in building
    assert "waiting for another process" in S(K.WAITING, seconds=3).message
    assert "torch attention path runs meanwhile" in S(K.WAITING).message
    assert S(K.FALLBACK, "TimeoutError: x").message.endswith("using the torch path (TimeoutError: x)")
    assert "switched to it" in S(K.READY, seconds=12, in_background=True).message
    assert "cached build" in S(K.READY, seconds=0.1).message
    assert [s.settled for s in map(S, K)] == [False, False, False, False, True, True]


BUILD_CODE = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    from minengine.layers import cpu_attention
    print("KERNEL", cpu_attention.build() is not None)
""")


def _build_in_subprocess(cache: str, extra_env: dict[str, str] | None = None, timeout: float = 240):
    """Build (or load) the kernel in a fresh process with ``cache`` as the build cache; returns the process."""
    env = dict(os.environ, **{cpu_attention.CACHE_ENV: cache}, **(extra_env or {}))
    return subprocess.run([sys.executable, "-c", BUILD_CODE], env=env, capture_output=True, text=True, timeout=timeout)


@needs_compiler
def test_no_compiler_means_the_torch_path_with_a_warning(tmp_path):
    done = _build_in_subprocess(str(tmp_path), {"CXX": "/bin/false", "PATH": "/nonexistent"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "KERNEL False" in done.stdout
    assert "CPU attention kernel unavailable, using the torch path" in done.stdout + done.stderr


def test_the_cpu_runner_starts_the_kernel_at_start_up(kernel, bundled_model, monkeypatch):
    """The build (seconds, the first time on a machine) starts when the engine is made, not in its first step,
    where it would land in a request's TTFT; with the switch off nothing is started."""
    from minengine.engine.llm_engine import LLMEngine

    monkeypatch.setattr(cpu_attention, "_PROCESS", cpu_attention.KernelLoader())
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, "0")
    LLMEngine.from_config(model=bundled_model, num_kv_blocks=8)
    assert cpu_attention.status().state is cpu_attention.KernelState.NOT_STARTED
    monkeypatch.delenv(cpu_attention.ENV_SWITCH)
    LLMEngine.from_config(model=bundled_model, num_kv_blocks=8)
    assert cpu_attention.status().state is cpu_attention.KernelState.READY  # this process has loaded it already


# The build machinery (the flock, the cache keys, a cached build left alone) is the same for any source: these tests
# build a one-function C++ library under the real names and directories, which compiles in about a second, so the
# suite compiles the real kernel only where its own build is the point (test_a_build_killed_in_its_link...).
PROBE_SOURCE = 'extern "C" int minengine_build_probe() { return 42; }\n'

PROBE_BUILD_CODE = textwrap.dedent("""
    import ctypes, sys
    from pathlib import Path
    from minengine.layers import cpu_kernel_build as kb
    kb.SOURCE = Path(sys.argv[1])  # what is built, and what the cache key hashes
    name = kb.default_name()
    library = kb.compile_library(name, kb.cache_directory(name), on_wait=lambda: print("waiting", flush=True),
                                 on_build=lambda: print("building", flush=True))
    print("PROBE", ctypes.CDLL(str(library)).minengine_build_probe(), flush=True)
""")


@pytest.fixture(scope="module")
def probe_source(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("probe") / "probe.cpp"
    source.write_text(PROBE_SOURCE)
    return source


def _probe_build(source: Path, cache: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """A process that builds ``source`` under its cache key into ``cache`` (``compile_library``), saying
    ``waiting`` / ``building`` as it goes and ``PROBE 42`` once it has loaded the library it made."""
    env = dict(os.environ, **{cpu_attention.CACHE_ENV: str(cache)}, **(extra_env or {}))
    return subprocess.Popen([sys.executable, "-c", PROBE_BUILD_CODE, str(source)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, out


@pytest.fixture(scope="module")
def cache_built_by_two_environments(probe_source, tmp_path_factory):
    """An empty cache that three processes build into at the same moment, two in this environment and one with a
    second environment's compiler (``second_compiler``). The test holds this environment's build lock until both
    of its processes say they wait, so the two surely contend; the other environment's build goes ahead meanwhile.
    (cache, second compiler, this environment's build directory, [(rc, output)] * 3)."""
    if shutil.which("c++") is None or shutil.which("ninja") is None:
        pytest.skip("no C++ compiler or ninja: the kernel cannot be built here")
    cache = tmp_path_factory.mktemp("kernel-cache")
    wrapper = second_compiler(tmp_path_factory.mktemp("env"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_kernel_build, "SOURCE", probe_source)
        ours = cache / cpu_attention.default_name()  # the key the children compute
    with cpu_kernel_build.build_lock(ours):
        procs = [_probe_build(probe_source, cache, extra) for extra in ({}, {}, {"CXX": str(wrapper)})]
        for proc in procs[:2]:  # (a warning printed at import may come first)
            assert any(line.strip() == "waiting" for line in iter(proc.stdout.readline, "")), "it never waited"
    return cache, wrapper, ours, [_finish(proc) for proc in procs]


def test_two_processes_building_into_an_empty_cache_both_get_the_kernel(cache_built_by_two_environments):
    """The flock serialises them: one compiles, the other waits, then finds the finished library whole and uses
    it without compiling."""
    _, _, _, results = cache_built_by_two_environments
    for rc, output in results[:2]:
        assert rc == 0 and "PROBE 42" in output, output
    assert sum(output.count("building") for _, output in results[:2]) == 1, results[:2]


def test_two_environments_building_at_once_keep_a_build_each(cache_built_by_two_environments, probe_source):
    """Two environments (two cache keys) building at the same moment into one cache: each gets its library, in its
    own directory, linked by its own build command; and the first environment's next start uses its build
    instead of compiling again (with one shared name, each would rebuild over the other's build)."""
    cache, wrapper, ours, results = cache_built_by_two_environments
    assert results[2][0] == 0 and "PROBE 42" in results[2][1], results[2][1]
    builds = sorted(p.parent for p in cache.glob("*/*.so"))
    assert len(builds) == 2 and ours in builds, builds
    commands = {(b / "build.ninja").read_text().split("cxx = ", 1)[1].split("\n", 1)[0] for b in builds}
    assert commands == {"c++", str(wrapper)}, commands
    log = (ours / ".ninja_log").read_text()
    rc, again = _finish(_probe_build(probe_source, cache))
    assert rc == 0 and "PROBE 42" in again and "building" not in again, again
    assert (ours / ".ninja_log").read_text() == log  # nothing recompiled or relinked


@pytest.fixture(scope="module")
def real_build(kernel) -> Path:
    """The directory of the real kernel's cached build (the ``kernel`` fixture built or found it)."""
    directory = cpu_attention.cache_directory(cpu_attention.default_name())
    library = directory / f"{cpu_attention.default_name()}.so"
    assert cpu_attention.library_is_whole(library), f"{library}: the kernel fixture left no whole build"
    return directory


def test_a_library_cut_short_is_judged_so_at_every_length(real_build, tmp_path):
    """Property: every truncation of a real build (a disk that filled during the link, a partial copy) is judged
    not whole, the whole file is; so is a file that is not ELF (on Linux)."""
    library = real_build / f"{cpu_attention.default_name()}.so"
    data = library.read_bytes()
    assert cpu_attention.library_is_whole(library)
    probe = tmp_path / "probe.so"
    for size in [0, 1, 16, 51, 52, 63, 64, 65] + list(range(100, len(data), max(1, len(data) // 97))) + [len(data) - 1]:
        probe.write_bytes(data[:size])
        assert not cpu_attention.library_is_whole(probe), f"{size} of {len(data)} bytes judged whole"
    if sys.platform.startswith("linux"):
        probe.write_bytes(b"INPUT(libfoo.so.1)\n")  # a linker script, not a library
        assert not cpu_attention.library_is_whole(probe)


def test_a_build_killed_in_its_link_blocks_nothing_and_is_rebuilt(real_build, tmp_path):
    """A build killed midway leaves torch's ``lock`` (a plain file: torch alone would wait for it forever) and, if
    killed during the link, a library cut short, which the loader would map and die on with SIGBUS. Kill a real
    build midway (its lock must be left), give its directory a real library cut in half, then a new process must
    remove the lock, notice the cut, compile and link again and end with the kernel. One length here (each relinks,
    ~20-50 s): that every length is judged cut short is the property test above."""
    name = cpu_attention.default_name()
    code = "from minengine.layers import cpu_attention; cpu_attention.build()"
    env = dict(os.environ, **{cpu_attention.CACHE_ENV: str(tmp_path)})
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    lock = tmp_path / name / "lock"
    try:
        for _ in range(600):  # torch creates its baton right before compiling
            if lock.exists():
                break
            if proc.poll() is not None:
                pytest.fail("the build finished before it could be interrupted")
            subprocess.run(["sleep", "0.05"])
        assert lock.exists(), "torch's build lock never appeared"
    finally:
        proc.kill()
        proc.wait()
    assert lock.exists()  # what the dead build left behind
    library = tmp_path / name / f"{name}.so"
    data = (real_build / f"{name}.so").read_bytes()
    library.write_bytes(data[:len(data) // 2])
    done = _build_in_subprocess(str(tmp_path))
    assert done.returncode == 0, f"exit {done.returncode}: {done.stdout}{done.stderr}"
    assert "KERNEL True" in done.stdout and "cut short; rebuilding" in done.stdout + done.stderr, done.stdout
    assert not lock.exists()
    assert cpu_attention.library_is_whole(library)


NO_HOME_CODE = textwrap.dedent("""
    import logging, pathlib, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    def no_home(cls):  # what Path.home does with HOME unset for a user without a passwd entry
        raise RuntimeError("Could not determine home directory.")
    pathlib.Path.home = classmethod(no_home)
    import torch
    from minengine.layers import cpu_attention
    op = cpu_attention.kernel_for(torch.zeros(1, 2, 32), torch.zeros(1, 4, 2, 32))  # never raises, never waits long
    print("KERNEL", (op or cpu_attention.get_kernel()) is not None)
""")


@pytest.mark.parametrize("where", ["no-home", "cache-is-a-file"])
def test_no_usable_cache_directory_means_the_torch_path_with_a_warning(tmp_path, where):
    """No home directory (HOME unset in a container run as an arbitrary user) and a cache path that is a file:
    the torch path, one warning that names the cause, exit 0 (never an exception out of ``kernel_for``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME", cpu_attention.CACHE_ENV)}
    if where == "cache-is-a-file":
        (tmp_path / "file").write_text("")
        env[cpu_attention.CACHE_ENV] = str(tmp_path / "file")
    done = subprocess.run([sys.executable, "-c", NO_HOME_CODE if where == "no-home" else BUILD_CODE], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "KERNEL False" in done.stdout
    warnings = [ln for ln in (done.stdout + done.stderr).splitlines() if "using the torch path" in ln]
    assert len(warnings) == 1, done.stdout + done.stderr
    assert ("set MINENGINE_KERNEL_CACHE" if where == "no-home" else "Not a directory") in warnings[0]


HOLD_CODE = textwrap.dedent("""
    import fcntl, sys, time
    handle = open(sys.argv[1], "a")
    fcntl.flock(handle, fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(3600)  # a build that never finishes
""")

STUCK_CODE = textwrap.dedent("""
    import json, os, signal, sys, time
    from minengine.layers import cpu_attention
    from minengine.__main__ import main

    started = time.monotonic()
    main(["generate", "To be, or not to be", "--max-tokens", "4"])  # the CLI, its kernel line on stderr
    cli_s = time.monotonic() - started
    after_cli = cpu_attention.status()

    from minengine import LLMEngine, SamplingParams
    from tests.conftest import hf_greedy

    model, prompts = sys.argv[1], json.loads(sys.argv[2])
    started = time.monotonic()
    engine = LLMEngine.from_config(model=model, num_kv_blocks=64)
    engine_s = time.monotonic() - started
    for i, p in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=24,
                                                                            ignore_eos=True))
    paths, outputs = [], {}
    while engine.has_unfinished_requests():
        ready = cpu_attention.status().state is cpu_attention.KernelState.READY
        if len(paths) == 6 and not ready:  # the stuck build ends mid-run: wait (not step) for the kernel
            os.kill(int(os.environ["HOLDER_PID"]), signal.SIGKILL)
            cpu_attention.get_kernel(timeout_s=240)
            continue
        paths.append(ready)
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
    print("RESULT", json.dumps({
        "cli_s": cli_s, "after_cli": after_cli.state.name, "engine_s": engine_s, "paths": paths,
        "final": cpu_attention.status().state.name, "reason": cpu_attention.status().reason,
        "equal_hf": [outputs[str(i)] == hf_greedy(model, tuple(p), 24) for i, p in enumerate(prompts)]}))
""")


def test_a_stuck_foreign_build_never_holds_up_a_start(real_build, bundled_model,
                                                       bundled_prompts, tmp_path):
    """A process that holds this cache key's build lock and never finishes (a start must not wait on it):
    the CLI and an engine start within seconds on the torch path, the CLI says it is waiting; when the lock is
    freed mid-run the engine takes the kernel between two steps, and every output is still transformers' greedy
    tokens (the switch is safe mid-run)."""
    name = cpu_attention.default_name()
    shutil.copytree(real_build, tmp_path / name)  # a whole build is cached: only the lock is in the way
    holder = subprocess.Popen([sys.executable, "-c", HOLD_CODE, str(tmp_path / name / "minengine-build.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        prompts = [bundled_prompts[i][:40] for i in (0, 3, 7)]
        env = dict(os.environ, **{cpu_attention.CACHE_ENV: str(tmp_path), "HOLDER_PID": str(holder.pid)})
        env.pop(cpu_attention.ENV_SWITCH, None)
        done = subprocess.run([sys.executable, "-c", STUCK_CODE, bundled_model, json.dumps(prompts)], env=env,
                              capture_output=True, text=True, timeout=400)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["after_cli"] == "WAITING", result
    assert "minengine: waiting for another process to finish building the CPU attention kernel" in done.stderr
    # far below the 180 s the old start waited (the bound is loose: the machine is shared, imports and the model
    # load are in it too)
    assert result["cli_s"] < 60 and result["engine_s"] < 30, result
    paths = result["paths"]
    assert paths[:6] == [False] * 6 and paths[6:] and all(paths[6:]), result  # torch, then the kernel mid-run
    assert result["final"] == "READY", result
    assert all(result["equal_hf"]), result

"""The CPU paged-attention kernel (``cpu_attention.cpp``): built once per machine and environment, in the
background, with the torch path meanwhile and as the fallback.

Why a kernel of our own: the torch path (``layers/reference_attention.py``) gathers each decode group's KV blocks into
one tensor and then runs SDPA over it, so the K/V cross memory about twice, and SDPA with the 1-8 query rows of a
KV head runs far below the machine's matmul rate. The kernel reads the blocks in place through the block table, the
keys in one pass and the values in a second with an exact softmax in between, each pass serving up to 4 query rows
(vLLM's CPU backend has its own attention kernels for the same reason). An FP8 cache (``kv_cache_dtype="fp8"``,
``layers/kv_quant.py``) is read in place too, each float8 byte widened to float32 as it is loaded, the per-tensor
``k_scale`` folded into the query and ``v_scale`` into the softmax's normalisation.

This file is what a step calls (``kernel_for``, ``use_kernel``); the build, the cache and the background loader are
``layers/cpu_kernel_build.py``. Without the kernel (``MINENGINE_CPU_KERNEL=0``, no C++ compiler, a build in
progress or failed) ``kernel_for`` returns None and the torch path (``layers/reference_attention.py``) runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from minengine.layers.cpu_kernel_build import (  # noqa: F401  (names this module has always offered)
    BUILD_LOCK_TIMEOUT_S,
    CACHE_ENV,
    CFLAGS,
    SOURCE,
    START_WAIT_S,
    KernelLoader,
    KernelState,
    KernelStatus,
    build,
    builder_main,
    cache_directory,
    compile_library,
    default_name,
    environment_tag,
    library_is_whole,
    machine_tag,
    reference_attention,
    self_check,
    source_tag,
)

ENV_SWITCH = "MINENGINE_CPU_KERNEL"  # "0" (or off/false/no) runs the torch path
DTYPES = (torch.float32, torch.bfloat16)  # the query's (and output's); the cache's too, or float8 e4m3fn
# Which requests the kernel takes (``use_kernel``): any with at most MAX_QUERY_LEN new tokens (decodes, short
# chunks, speculative verification), and longer prefill chunks while their keys number at most MAX_PREFILL_KEYS.
# Past that, SDPA's blocked kernel wins: the kernel reads a request's keys once per query token, from L2 while they
# fit; the two thresholds are where SDPA overtook the kernel (one core, causal prefill from position 0).
MAX_QUERY_LEN = 16
MAX_PREFILL_KEYS = 512


def use_kernel(q_len: int, seq_len: int) -> bool:
    """Whether the kernel (rather than SDPA) attends a request with ``q_len`` new tokens and ``seq_len`` keys."""
    return q_len <= MAX_QUERY_LEN or seq_len <= MAX_PREFILL_KEYS


def is_disabled() -> bool:
    """True when ``MINENGINE_CPU_KERNEL`` turns the kernel off (read at every call, so tests can flip it)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "off", "false", "no")


_PROCESS = KernelLoader()  # this process's kernel: a library registers its op namespace once per process


def _start_over_after_fork() -> None:
    """In a forked child (a tensor-parallel worker): a settled kernel stays (the loaded library is in the copied
    memory), but a start still under way ran in a thread the fork did not copy, and its lock may be held by it:
    the child gets a loader of its own, which starts again on first use. The parent's listeners stay behind."""
    global _PROCESS
    parent = _PROCESS
    _PROCESS = KernelLoader(parent._name, parent._directory, parent._lock_timeout_s)
    if parent._status.settled:
        _PROCESS._status, _PROCESS.op, _PROCESS._started_at = parent._status, parent.op, parent._started_at


os.register_at_fork(after_in_child=_start_over_after_fork)


def start(wait_s: float = START_WAIT_S) -> KernelStatus:
    """Start this process's kernel (once; the CPU ``ModelRunner`` calls it at start-up) and wait at most ``wait_s``
    seconds: a cached build is ready by then; a compile or another process's build goes on in the background while
    the engine runs the torch path (``KernelLoader.start``). Returns the status."""
    return _PROCESS.start(wait_s)


def status() -> KernelStatus:
    """Where this process's kernel stands: ``KernelStatus`` (state, reason, name, seconds, message)."""
    return _PROCESS.status()


def on_change(listener: Callable[[KernelStatus], None]) -> Callable[[], None]:
    """Call ``listener(status)`` at every change of this process's kernel state; returns its remover."""
    return _PROCESS.on_change(listener)


def get_kernel(timeout_s: float | None = None) -> Callable | None:
    """The kernel of this process, waiting for its build (up to ``timeout_s`` seconds; None: as long as the build
    takes, bounded by the builder's lock timeout): the op, or None (the torch path) after a failed build. For
    benchmarks and tests that need to know which path runs; engines use ``start`` and never wait long."""
    _PROCESS.start(0.0)
    _PROCESS.wait(timeout_s)
    return _PROCESS.kernel()


def applies(device: torch.device | str, dtype: torch.dtype, head_dim: int,
            cache_dtype: torch.dtype | None = None) -> bool:
    """Whether the kernel can serve a model of this device, dtype (float32 or bfloat16) and head_dim (a multiple
    of 8 up to 512) with a KV cache of ``cache_dtype`` (None: ``dtype``; or float8 e4m3fn) on the CPU, and is not
    switched off; says nothing about whether it builds."""
    cache_dtype = dtype if cache_dtype is None else cache_dtype
    return (torch.device(device).type == "cpu" and dtype in DTYPES and cache_dtype in (dtype, torch.float8_e4m3fn)
            and head_dim % 8 == 0 and head_dim <= 512 and not is_disabled())


def kernel_for(query: torch.Tensor, k_cache: torch.Tensor) -> Callable | None:
    """The kernel when it applies to this layer's tensors (``applies``: ``query`` of the cache's dtype, or an FP8
    cache) and is ready, else None (the torch path). Never waits for a build in progress; the first call of a
    process starts it (``start``: at most ``START_WAIT_S``; the CPU ``ModelRunner`` has usually done that at
    start-up)."""
    if not applies(query.device, query.dtype, k_cache.shape[-1], k_cache.dtype):
        return None
    op = _PROCESS.op  # set once the kernel is ready: each step reads it, no call
    return op if op is not None else _PROCESS.kernel()

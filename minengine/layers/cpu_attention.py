"""The CPU paged-attention kernel (``cpu_attention.cpp``): built at first use, with the torch path as the fallback.

Why a kernel of our own: the torch path (``paged_attention_reference``) gathers each decode group's KV blocks into
one tensor and then runs SDPA over it, so the K/V cross memory about twice, and SDPA with the 1-8 query rows of a
KV head runs far below the machine's matmul rate. The kernel reads the blocks in place through the block table, the
keys in one pass and the values in a second with an exact softmax in between, each pass serving up to 4 query rows
(vLLM's CPU backend has its own attention kernels for the same reason). An FP8 cache (``kv_cache_dtype="fp8"``,
``layers/kv_quant.py``) is read in place too, each float8 byte widened to float32 as it is loaded, the per-tensor
``k_scale`` folded into the query and ``v_scale`` into the softmax's normalisation.

Build: ``torch.utils.cpp_extension.load_inline`` compiles the C++ source with ``-O3 -march=native -fopenmp`` (ninja and
a C++ compiler: ``pip install ninja``, g++ or clang) into ``~/.cache/minengine/kernels/<name>`` (or
``$MINENGINE_KERNEL_CACHE/<name>``) and registers ``torch.ops.minengine.paged_attention``. It includes only
``torch/library.h`` (not ``torch/extension.h``), which keeps the first build to ~10 s rather than a minute; later
processes load the cached library. ``-march=native`` makes the library specific to this CPU, so its name carries a
hash of the CPU's model and flags: a home directory shared by different machines gets one build per CPU type, never
a wrong one; it also carries a hash of the source, the flags and torch's version, so checkouts of different versions
sharing one cache keep one build each instead of rebuilding over each other. Builds are serialised by an ``flock``
on a file in that directory, which the operating system releases when its holder dies; under it, a ``lock`` file
that torch's own build lock left behind (a process killed mid-build: every later build would wait for it forever)
is removed before building, and so is a cached library cut short (``library_is_whole``: loading one kills the
process with SIGBUS), which is then rebuilt.

Fallback: with ``MINENGINE_CPU_KERNEL=0``, on a machine without a working C++ compiler, or if the built kernel
fails its self-check (a tiny problem against a float64 reference), ``kernel_for`` returns None and the torch path
runs; one log line says why. Nothing raises.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_attention.cpp")
ENV_SWITCH = "MINENGINE_CPU_KERNEL"  # "0" (or off/false/no) runs the torch path
CACHE_ENV = "MINENGINE_KERNEL_CACHE"  # where builds go (default ~/.cache/minengine/kernels)
BUILD_LOCK_TIMEOUT_S = 180.0  # waiting longer than this for another process's build (~10 s here): the torch path
CFLAGS = ["-O3", "-march=native", "-fopenmp"]
DTYPES = (torch.float32, torch.bfloat16)  # the query's (and output's); the cache's too, or float8 e4m3fn
# Which requests the kernel takes (``use_kernel``): any with at most MAX_QUERY_LEN new tokens (decodes, short
# chunks, speculative verification), and longer prefill chunks while their keys number at most MAX_PREFILL_KEYS.
# Past that, SDPA's blocked kernel wins: the kernel reads a request's keys once per query token, from L2 while they
# fit. Measured on one core of this project's machine (2026-12-01, causal prefill from position 0, kernel vs
# SDPA): 492 keys 2.5 vs 3.2 ms (Hkv 2, G 4, D 32), 3.0 vs 4.3 ms (D 64), 11.7 vs 16.4 ms (D 128); 768 keys
# about even; 1,536 keys 23.3 vs 19.2 ms (D 32) and 353 vs 258 ms (Hkv 8, G 4, D 128).
MAX_QUERY_LEN = 16
MAX_PREFILL_KEYS = 512


def use_kernel(q_len: int, seq_len: int) -> bool:
    """Whether the kernel (rather than SDPA) attends a request with ``q_len`` new tokens and ``seq_len`` keys."""
    return q_len <= MAX_QUERY_LEN or seq_len <= MAX_PREFILL_KEYS


def is_disabled() -> bool:
    """True when ``MINENGINE_CPU_KERNEL`` turns the kernel off (read at every call, so tests can flip it)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "off", "false", "no")


def machine_tag() -> str:
    """8 hex digits naming this CPU type (model name and feature flags from /proc/cpuinfo, else the platform)."""
    text = platform.machine() + platform.processor()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        text += "".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags", "Features"))}))
    except OSError:
        pass
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def source_tag() -> str:
    """8 hex digits naming what is built: the C++ source, the compiler flags and torch's version."""
    text = SOURCE.read_text() + " ".join(CFLAGS) + torch.__version__
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def default_name() -> str:
    """The extension's name: ``minengine_cpu_attention_<machine_tag()>_<source_tag()>``."""
    return f"minengine_cpu_attention_{machine_tag()}_{source_tag()}"


def cache_directory(name: str) -> Path:
    """The build directory of extension ``name``: ``$MINENGINE_KERNEL_CACHE/<name>``, else
    ``$XDG_CACHE_HOME/minengine/kernels/<name>`` (``~/.cache`` when XDG_CACHE_HOME is unset).

    Raises:
        RuntimeError: no cache variable is set and there is no home directory (``HOME`` unset and the user
            has no passwd entry, as in a container run with an arbitrary ``--user``).
    """
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / name
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = Path.home() / ".cache"
        except RuntimeError:
            raise RuntimeError(f"no home directory to keep the kernel in: set {CACHE_ENV}") from None
    return Path(base) / "minengine" / "kernels" / name


@contextlib.contextmanager
def build_lock(directory: Path, timeout_s: float = BUILD_LOCK_TIMEOUT_S):
    """Hold an exclusive ``flock`` on ``directory/minengine-build.lock`` (creating both) for the block's duration.

    The OS releases an flock when the process holding it exits, however it exits, so a build killed midway never
    blocks the next one. Inside the lock no other minengine build of this extension runs, so a ``lock`` file
    there is the leftover of torch's ``FileBaton`` from a dead build, and is removed.

    Raises:
        TimeoutError: another process held the lock for more than ``timeout_s`` seconds.
        ImportError: no ``fcntl`` (Windows); the caller falls back to the torch path.
    """
    import fcntl

    directory.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with open(directory / "minengine-build.lock", "a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"another process has been building in {directory} for over {timeout_s:.0f} s") from None
                time.sleep(0.1)
        try:
            (directory / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def library_is_whole(path: Path) -> bool:
    """False when ``path`` is an ELF file shorter than its own headers say (a build cut short by a full disk or a
    crash, a partial copy), or is not ELF at all on Linux. The dynamic loader maps such a file without complaint and
    the process dies of SIGBUS when it touches the missing pages, so it must never be loaded. Non-ELF files on other
    systems (Mach-O) are not judged: True."""
    import struct
    import sys

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = f.read(64)
            if header[:4] != b"\x7fELF":
                return not sys.platform.startswith("linux")
            if len(header) < 52 or header[4] not in (1, 2) or header[5] not in (1, 2):
                return False
            wide, order = header[4] == 2, "<" if header[5] == 1 else ">"
            # Program header fields (type, file offset, bytes in the file): ELF64 and ELF32 lay them out differently.
            entry_format = order + ("I4xQ16xQ" if wide else "II8xI")
            # (program headers' offset, sections' offset) then (ph entry size, ph count, sh entry size, sh count)
            ph_off, sh_off = struct.unpack_from(order + ("QQ" if wide else "II"), header, 0x20 if wide else 0x1C)
            ph_size, ph_num, sh_size, sh_num = struct.unpack_from(order + "HHHH", header, 0x36 if wide else 0x2A)
            if ph_off + ph_size * ph_num > size or sh_off + sh_size * sh_num > size:
                return False
            f.seek(ph_off)
            table = f.read(ph_size * ph_num)
            for i in range(ph_num):  # every segment's bytes must be in the file
                kind, offset, filesz = struct.unpack_from(entry_format, table, i * ph_size)
                if kind and offset + filesz > size:
                    return False
    except (OSError, struct.error):
        return False
    return True


def build(name: str | None = None, build_directory: str | Path | None = None) -> Callable | None:
    """Compile (or load the cached build of) the kernel and self-check it.

    Args:
        name: extension name; default ``default_name()``.
        build_directory: default ``cache_directory(name)``.

    Returns:
        ``torch.ops.minengine.paged_attention``, or None (with one warning logged) if anything fails: no
        compiler or ninja, a compile error, a failed self-check, another process's build that does not finish,
        a cache directory that cannot be made or written, no home directory to put it in.
    """
    start = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load_inline

        name = name or default_name()
        directory = Path(build_directory) if build_directory else cache_directory(name)
        if not hasattr(torch.ops.minengine, "paged_attention"):  # one registration per process
            with build_lock(directory):
                library = directory / f"{name}.so"
                if library.exists() and not library_is_whole(library):
                    logger.warning("minengine: the cached CPU attention kernel %s is cut short; rebuilding it", library)
                    for built in (library, *directory.glob("*.o")):
                        built.unlink()
                load_inline(name=name, cpp_sources=[SOURCE.read_text()], extra_cflags=CFLAGS,
                            extra_ldflags=["-fopenmp"], build_directory=str(directory), is_python_module=False,
                            no_implicit_headers=True)
        op = torch.ops.minengine.paged_attention
        error = self_check(op)
        if error > 1e-4:
            raise RuntimeError(f"self-check failed: max error {error:.2e} against the float64 reference")
    except Exception as exc:  # any failure means the torch path, never a crash
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        logger.warning("minengine: CPU attention kernel unavailable, using the torch path (%s: %s)",
                       type(exc).__name__, first[:300])
        return None
    logger.info("minengine: CPU attention kernel ready in %.1f s (%s)", time.perf_counter() - start, name)
    return op


@functools.cache
def get_kernel() -> Callable | None:
    """The kernel of this process: ``build()`` once (compile or load), then the same op, or None (the torch
    path) every time after a failed build."""
    return build()


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
    cache) and builds, else None. The first call in a process builds or loads it (the CPU ``ModelRunner`` calls
    ``get_kernel`` at start-up, so no step pays for the compile)."""
    if not applies(query.device, query.dtype, k_cache.shape[-1], k_cache.dtype):
        return None
    return get_kernel()


def reference_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor, q_len: int, scale: float,
                        k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """What the kernel computes, in float64, one request at a time: request i's q_len rows
    ``query[i * q_len:(i + 1) * q_len]`` ([rows, Hq, D]) attend causally to its first ``seq_lens[i]`` keys,
    read slot by slot through ``block_tables[i]`` (stored keys times ``k_scale``, values times ``v_scale``).
    Returns [N * q_len, Hq, D] float64."""
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = query.shape[1] // num_kv_heads
    out = torch.zeros(query.shape, dtype=torch.float64)
    for i, seq_len in enumerate(seq_lens.tolist()):
        pos = torch.arange(seq_len)
        blocks = block_tables[i, pos // block_size]
        k = k_cache[blocks, pos % block_size].double().repeat_interleave(group, 1) * k_scale  # [seq_len, Hq, D]
        v = v_cache[blocks, pos % block_size].double().repeat_interleave(group, 1) * v_scale
        q = query[i * q_len:(i + 1) * q_len].double()
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
        scores = scores.masked_fill(pos[None, :] > q_pos, float("-inf"))
        out[i * q_len:(i + 1) * q_len] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def self_check(op: Callable) -> float:
    """Max abs error of ``op`` against ``reference_attention`` on a small float32 problem (GQA 2, head_dim 32,
    two requests over scattered blocks, one decode-shaped and one with 3 new tokens), with a float32 cache and with
    an FP8 one (scales 0.5 and 2: the reference reads the same float8 bytes, so both must agree to float32
    rounding)."""
    gen = torch.Generator().manual_seed(0)
    block_size, num_kv_heads, heads, dim = 4, 2, 4, 32
    k_cache = torch.randn(9, block_size, num_kv_heads, dim, generator=gen)
    v_cache = torch.randn(9, block_size, num_kv_heads, dim, generator=gen)
    block_tables = torch.tensor([[7, 2, 5, 0], [3, 8, 1, 6]])
    worst = 0.0
    for q_len, seq_lens in ((1, [13, 6]), (3, [3, 16])):
        seq = torch.tensor(seq_lens, dtype=torch.int32)
        query = torch.randn(2 * q_len, heads, dim, generator=gen)
        for k, v, k_scale, v_scale in ((k_cache, v_cache, 1.0, 1.0),
                                       (k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn), 0.5, 2.0)):
            out = torch.empty_like(query)
            op(out, query, k, v, block_tables, seq, q_len, dim ** -0.5, 1, k_scale, v_scale)
            ref = reference_attention(query, k, v, block_tables, seq, q_len, dim ** -0.5, k_scale, v_scale)
            worst = max(worst, (out.double() - ref).abs().max().item())
    return worst

"""The CPU paged-attention kernel (``cpu_attention.cpp``): built once per machine and environment, in the
background, with the torch path meanwhile and as the fallback.

Why a kernel of our own: the torch path (``paged_attention_reference``) gathers each decode group's KV blocks into
one tensor and then runs SDPA over it, so the K/V cross memory about twice, and SDPA with the 1-8 query rows of a
KV head runs far below the machine's matmul rate. The kernel reads the blocks in place through the block table, the
keys in one pass and the values in a second with an exact softmax in between, each pass serving up to 4 query rows
(vLLM's CPU backend has its own attention kernels for the same reason). An FP8 cache (``kv_cache_dtype="fp8"``,
``layers/kv_quant.py``) is read in place too, each float8 byte widened to float32 as it is loaded, the per-tensor
``k_scale`` folded into the query and ``v_scale`` into the softmax's normalisation.

Build: ``torch.utils.cpp_extension.load_inline`` compiles the C++ source with ``-O3 -march=native -fopenmp`` (ninja and
a C++ compiler: ``pip install ninja``, g++ or clang) into ``~/.cache/minengine/kernels/<name>`` (or
``$MINENGINE_KERNEL_CACHE/<name>``); the library registers ``torch.ops.minengine.paged_attention``. It includes only
``torch/library.h`` (not ``torch/extension.h``), which keeps a build to ~10 s rather than a minute. The name is the
cache key: hashes of the CPU's model and flags (``-march=native`` makes the library specific to this CPU), of what
is built (the source, the flags, torch's version) and of the environment that builds it (torch's install
directory, Python's headers, the compiler: ``environment_tag``), so checkouts, virtualenvs and machines sharing one
home directory keep one build each instead of rebuilding over each other. Builds are serialised by an ``flock`` on
a file in that directory, which the operating system releases when its holder dies; under it, a ``lock`` file that
torch's own build lock left behind (a process killed mid-build: every later build would wait for it forever) is
removed before building, and so is a cached library cut short (``library_is_whole``: loading one kills the process
with SIGBUS), which is then rebuilt.

Start-up (``start``, called by the CPU ``ModelRunner``): a cached build is loaded at once (milliseconds). Anything
slower, a compile or another process's build of the same key (``flock`` held), goes to a builder process in the
background (``python -m minengine.layers.cpu_attention NAME DIR``) and the start waits at most ``START_WAIT_S``:
the engine runs the torch path meanwhile and takes the kernel from the first attention call after it is loaded.
Why a background build rather than waiting: a start must never depend on another process (the 180 s waits of issue
21) or on the compiler's speed, and the two paths give the same greedy tokens
(``tests/equivalence/test_equivalence_hf.py`` checks both against transformers), so switching between layers or
steps is safe. Why a process rather than a thread: it holds the build lock for its whole build and finishes it even
if the engine's process exits or is interrupted (its own session, so Ctrl-C does not stop it), so a cache is never
left half built, and the next start finds the library. ``status()`` says where it stands (``KernelStatus``: loading,
waiting for another process, building, ready, fell back to the torch path with the reason); ``on_change`` tells a
listener (the CLI prints it, the dashboard shows it).

Fallback: with ``MINENGINE_CPU_KERNEL=0``, on a machine without a working C++ compiler, if another process's build
holds the lock past ``BUILD_LOCK_TIMEOUT_S``, or if the built kernel fails its self-check (a tiny problem against a
float64 reference), ``kernel_for`` returns None and the torch path runs; one log line says why. Nothing raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_attention.cpp")
ENV_SWITCH = "MINENGINE_CPU_KERNEL"  # "0" (or off/false/no) runs the torch path
CACHE_ENV = "MINENGINE_KERNEL_CACHE"  # where builds go (default ~/.cache/minengine/kernels)
BUILD_LOCK_TIMEOUT_S = 180.0  # waiting longer than this for another process's build (~10 s here): the torch path
START_WAIT_S = 2.0  # the most an engine's start waits for the kernel (a cached load takes milliseconds)
FAST_LOCK_WAIT_S = 0.5  # how long start-up tries for the build lock before handing the work to the builder
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


def compiler() -> str:
    """The C++ compiler a build would use (``$CXX``, else ``c++``, as torch's builder), resolved to its real file
    where it is on the PATH (``c++`` is often a chain of links to one g++)."""
    cxx = os.environ.get("CXX", "c++")
    found = shutil.which(cxx)
    return os.path.realpath(found) if found else cxx


def environment_tag() -> str:
    """8 hex digits naming the environment a build is made in: what its build command names (torch's install
    directory, whose headers it includes and whose libraries it links; Python's headers; the compiler). Two
    virtualenvs with their own torch get two tags, so their builds never overwrite each other (issue 21: four
    checkouts' venvs rebuilt one cached build 15 times in turn); environments sharing one torch share a build."""
    torch_dir = os.path.realpath(os.path.dirname(torch.__file__))
    text = "|".join([torch_dir, torch.__version__, sysconfig.get_paths()["include"], sys.version, compiler()])
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def default_name() -> str:
    """The extension's name and cache key:
    ``minengine_cpu_attention_<machine_tag()>_<source_tag()>_<environment_tag()>``."""
    return f"minengine_cpu_attention_{machine_tag()}_{source_tag()}_{environment_tag()}"


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
def build_lock(directory: Path, timeout_s: float = BUILD_LOCK_TIMEOUT_S, on_wait: Callable[[], None] | None = None,
               give_up: Callable[[], bool] | None = None):
    """Hold an exclusive ``flock`` on ``directory/minengine-build.lock`` (creating both) for the block's duration.

    The OS releases an flock when the process holding it exits, however it exits, so a build killed midway never
    blocks the next one. Inside the lock no other minengine build of this extension runs, so a ``lock`` file
    there is the leftover of torch's ``FileBaton`` from a dead build, and is removed.

    Args:
        timeout_s: the longest wait for another holder, in seconds.
        on_wait: called once if the lock is held by another process (before waiting for it).
        give_up: polled while waiting; True stops the wait with a ``TimeoutError``.

    Raises:
        TimeoutError: another process held the lock for more than ``timeout_s`` seconds, or ``give_up()``.
        ImportError: no ``fcntl`` (Windows); the caller falls back to the torch path.
    """
    import fcntl

    directory.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with open(directory / "minengine-build.lock", "a") as handle:
        waited = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited and on_wait is not None:
                    on_wait()
                waited = True
                if time.monotonic() > deadline or (give_up is not None and give_up()):
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


def _short(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters): a reason that fits one log line."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:300]}"


def compile_library(name: str, directory: Path, on_wait: Callable[[], None] | None = None,
                    on_build: Callable[[], None] | None = None, give_up: Callable[[], bool] | None = None,
                    lock_timeout_s: float = BUILD_LOCK_TIMEOUT_S) -> Path:
    """Make ``directory/<name>.so`` whole, under the build lock: nothing if a whole build is cached; else remove a
    library cut short and compile and link (``load_inline``, which also loads it into this process).

    Args:
        on_wait: called if another process holds the lock (``build_lock``); on_build: called before compiling.
        give_up, lock_timeout_s: as ``build_lock``.

    Returns:
        The library's path.

    Raises:
        Whatever the build raises: ``TimeoutError`` (the lock), ``RuntimeError`` (no ninja, a compile error),
        ``OSError`` (a cache directory that cannot be made or written).
    """
    library = directory / f"{name}.so"
    with build_lock(directory, lock_timeout_s, on_wait, give_up):
        if library.exists() and library_is_whole(library):
            return library
        if library.exists():
            logger.warning("minengine: the cached CPU attention kernel %s is cut short; rebuilding it", library)
            for built in (library, *directory.glob("*.o")):
                built.unlink()
        if on_build is not None:
            on_build()
        from torch.utils.cpp_extension import load_inline

        load_inline(name=name, cpp_sources=[SOURCE.read_text()], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"],
                    build_directory=str(directory), is_python_module=False, no_implicit_headers=True)
    return library


def _load_and_check(library: Path) -> Callable:
    """Load ``library`` into this process (once: a second library of the namespace cannot register) and return
    its op after the self-check.

    Raises:
        RuntimeError: the library is cut short, or the self-check's error is over 1e-4.
        OSError: the loader refused it.
    """
    if not hasattr(torch.ops.minengine, "paged_attention"):
        if not library_is_whole(library):
            raise RuntimeError(f"{library} is cut short")
        torch.ops.load_library(str(library))
    op = torch.ops.minengine.paged_attention
    error = self_check(op)
    if error > 1e-4:
        raise RuntimeError(f"self-check failed: max error {error:.2e} against the float64 reference")
    return op


def build(name: str | None = None, build_directory: str | Path | None = None) -> Callable | None:
    """Compile (or load the cached build of) the kernel in this process, waiting as long as that takes, and
    self-check it. Engines use ``start`` instead, which never waits more than ``START_WAIT_S``.

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
        name = name or default_name()
        directory = Path(build_directory) if build_directory else cache_directory(name)
        library = directory / f"{name}.so"
        if not hasattr(torch.ops.minengine, "paged_attention"):  # one registration per process
            library = compile_library(name, directory)
        op = _load_and_check(library)
    except Exception as exc:  # any failure means the torch path, never a crash
        logger.warning("minengine: CPU attention kernel unavailable, using the torch path (%s)", _short(exc))
        return None
    logger.info("minengine: CPU attention kernel ready in %.1f s (%s)", time.perf_counter() - start, name)
    return op


class KernelState(enum.Enum):
    """Where the kernel of this process stands (``KernelStatus.state``)."""

    NOT_STARTED = "not started"
    LOADING = "loading"  # looking for a cached build (milliseconds when there is one)
    WAITING = "waiting for another process"  # another process holds this key's build lock; the torch path runs
    BUILDING = "building"  # the builder process compiles (~10 s, once per machine and environment); the torch path
    READY = "ready"  # kernel_for hands out the kernel
    FALLBACK = "fell back to the torch path"  # for good in this process; ``reason`` says why


@dataclasses.dataclass(frozen=True)
class KernelStatus:
    """One look at the kernel's build (``status()``).

    Attributes:
        state: a ``KernelState``.
        reason: why it fell back (``FALLBACK``), e.g. ``"TimeoutError: another process has been building in ...
            for over 180 s"``; empty otherwise.
        name: the extension's name (the cache key); empty before the start resolved it.
        seconds: since ``start``, in seconds (for ``READY`` / ``FALLBACK``: how long it took to get there).
        in_background: the start could not finish at once (a build or another process's lock), so the engine ran
            the torch path before the kernel; False for a cached load.
    """

    state: KernelState
    reason: str = ""
    name: str = ""
    seconds: float = 0.0
    in_background: bool = False

    @property
    def settled(self) -> bool:
        """True once nothing will change any more in this process (``READY`` or ``FALLBACK``)."""
        return self.state in (KernelState.READY, KernelState.FALLBACK)

    @property
    def message(self) -> str:
        """One line for a person (English), e.g. "building the CPU attention kernel (once, ~10 s); the torch
        attention path runs meanwhile"."""
        meanwhile = "the torch attention path runs meanwhile"
        if self.state is KernelState.NOT_STARTED:
            return "the CPU attention kernel is not started"
        if self.state is KernelState.LOADING:
            return "loading the CPU attention kernel"
        if self.state is KernelState.WAITING:
            return (f"waiting for another process to finish building the CPU attention kernel ({self.seconds:.0f} s "
                    f"so far); {meanwhile}")
        if self.state is KernelState.BUILDING:
            return f"building the CPU attention kernel (once, ~10 s); {meanwhile}"
        if self.state is KernelState.READY:
            how = "switched to it from the torch path" if self.in_background else "cached build"
            return f"CPU attention kernel ready after {self.seconds:.1f} s ({how})"
        return f"CPU attention kernel unavailable, using the torch path ({self.reason})"


class KernelLoader:
    """The kernel of one process: started once (``start``), built or loaded in the background, handed out by
    ``kernel`` when ready. One per process (``_PROCESS``), because a library registers the ``minengine``
    namespace once per process.

    Args:
        name: extension name (None: ``default_name()`` at start); directory: its cache (None: ``cache_directory``).
        lock_timeout_s: how long the builder waits for another process's build before giving up.
    """

    def __init__(self, name: str | None = None, directory: Path | None = None,
                 lock_timeout_s: float = BUILD_LOCK_TIMEOUT_S):
        self._name, self._directory, self._lock_timeout_s = name, directory, lock_timeout_s
        self._changed = threading.Condition()
        self._status = KernelStatus(KernelState.NOT_STARTED)
        self._started_at = 0.0
        self._op: Callable | None = None
        self._listeners: list[Callable[[KernelStatus], None]] = []

    def status(self) -> KernelStatus:
        """Where it stands now (``seconds`` counts up while it waits or builds)."""
        with self._changed:
            s = self._status
        if not s.settled and s.state is not KernelState.NOT_STARTED:
            s = dataclasses.replace(s, seconds=time.monotonic() - self._started_at)
        return s

    def on_change(self, listener: Callable[[KernelStatus], None]) -> Callable[[], None]:
        """Call ``listener(status)`` at every change of state from now on (from the thread that made the change;
        it must not raise or block). Returns a function that removes it."""
        with self._changed:
            self._listeners.append(listener)

        def remove() -> None:
            with self._changed:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def _set(self, state: KernelState, reason: str = "", name: str | None = None) -> None:
        with self._changed:
            if self._status.settled or (state is self._status.state and name is None):
                return
            background = self._status.in_background or state in (KernelState.WAITING, KernelState.BUILDING)
            self._status = KernelStatus(state, reason, self._status.name if name is None else name,
                                        time.monotonic() - self._started_at, background)
            status, listeners = self._status, list(self._listeners)
        # said before waiters wake, so a line about the build comes before what the engine prints next
        if state is KernelState.READY:
            logger.info("minengine: %s (%s)", status.message, status.name)
        elif state is KernelState.FALLBACK:
            logger.warning("minengine: %s", status.message)
        elif state in (KernelState.WAITING, KernelState.BUILDING):
            logger.info("minengine: %s", status.message)
        for listener in listeners:
            with contextlib.suppress(Exception):  # a broken listener must not stop the build
                listener(status)
        with self._changed:
            self._changed.notify_all()

    def start(self, wait_s: float = START_WAIT_S) -> KernelStatus:
        """Begin (once; later calls return at once) and wait up to ``wait_s`` seconds for the kernel to be ready or
        to fall back. Never raises. Returns the status."""
        with self._changed:
            first = self._status.state is KernelState.NOT_STARTED
            if first:
                self._started_at = time.monotonic()
                self._status = KernelStatus(KernelState.LOADING)
        if first:
            threading.Thread(target=self._run, name="minengine-cpu-kernel", daemon=True).start()
            self.wait(wait_s)
        return self.status()

    def wait(self, timeout_s: float | None = None) -> KernelStatus:
        """Wait until ready or fallen back (None: as long as it takes; the builder gives up after the lock
        timeout) or ``timeout_s`` seconds pass. Returns the status."""
        with self._changed:
            self._changed.wait_for(lambda: self._status.settled or self._status.state is KernelState.NOT_STARTED,
                                   timeout_s)
        return self.status()

    def kernel(self) -> Callable | None:
        """The op once ready, else None (the torch path): never blocks, except that the first call of a process
        starts the build (``start``)."""
        op = self._op
        if op is not None:
            return op
        if self._status.state is KernelState.NOT_STARTED:
            self.start()
        return self._op

    def _run(self) -> None:
        try:
            name = self._name or default_name()
            directory = self._directory or cache_directory(name)
            self._set(KernelState.LOADING, name=name)
            library = directory / f"{name}.so"
            if not hasattr(torch.ops.minengine, "paged_attention"):
                state = KernelState.WAITING  # unless the lock is free and the library is cached or missing
                with contextlib.suppress(TimeoutError):
                    with build_lock(directory, FAST_LOCK_WAIT_S):
                        state = KernelState.READY if library_is_whole(library) else KernelState.BUILDING
                        if state is KernelState.READY:
                            torch.ops.load_library(str(library))
                if state is not KernelState.READY:
                    self._set(state)  # said now: the builder takes a second or more to start and report
                    self._build_elsewhere(name, directory)
            op = _load_and_check(library)
        except Exception as exc:  # any failure means the torch path, never a crash
            self._set(KernelState.FALLBACK, _short(exc))
            return
        self._op = op
        self._set(KernelState.READY)

    def _build_elsewhere(self, name: str, directory: Path) -> None:
        """Run the builder process (``builder_main``) and follow its reports until it has made the library.

        Raises:
            RuntimeError: the builder failed (its reason) or ended without saying so.
        """
        root = str(Path(__file__).resolve().parents[2])  # this minengine, whatever the child's sys.path says
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        proc = subprocess.Popen([sys.executable, "-m", "minengine.layers.cpu_attention", name, str(directory),
                                 str(self._lock_timeout_s)], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        outcome, tail = None, []
        for line in proc.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "waiting":
                self._set(KernelState.WAITING)
            elif word == "building":
                self._set(KernelState.BUILDING)
            elif word in ("done", "failed"):
                outcome = (word, rest)
            elif line.strip():
                tail = (tail + [line.strip()])[-3:]
        code = proc.wait()
        if outcome is None or outcome[0] != "done" or code != 0:
            said = outcome[1] if outcome else (" / ".join(tail) or "no output")
            raise RuntimeError(f"the kernel's builder process exited with code {code}: {said}")


_PROCESS = KernelLoader()  # this process's kernel: a library registers its op namespace once per process


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
    return _PROCESS.kernel()


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


def builder_main(argv: list[str]) -> int:
    """The builder process (``python -m minengine.layers.cpu_attention NAME DIR [LOCK_TIMEOUT_S]``): make the
    library whole (``compile_library``), saying on stdout ``waiting`` (another process holds the lock),
    ``building`` (compiling), then ``done`` or ``failed <reason>``. While it waits it gives up if the engine
    that started it is gone; once compiling it finishes, whoever is left, so the cache is never left half built.
    Returns the exit code (0 done, 1 failed)."""
    name, directory = argv[0], Path(argv[1])
    lock_timeout_s = float(argv[2]) if len(argv) > 2 else BUILD_LOCK_TIMEOUT_S
    parent = os.getppid()

    def say(line: str) -> None:
        with contextlib.suppress(OSError):  # the engine may have exited: the build goes on
            print(line, flush=True)

    try:
        compile_library(name, directory, on_wait=lambda: say("waiting"), on_build=lambda: say("building"),
                        give_up=lambda: os.getppid() != parent, lock_timeout_s=lock_timeout_s)
    except Exception as exc:
        say(f"failed {_short(exc)}")
        return 1
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(builder_main(sys.argv[1:]))

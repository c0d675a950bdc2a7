"""``python -m minengine serve`` as a child process on 127.0.0.1, waited for until ``/health`` answers.

One helper for everything that starts a real server process: chapter 9, the tests that signal a server
(``tests/server/test_shutdown_drain.py``, ``tests/server/test_serve_cli.py``) and the benchmarks that measure one
(``benchmarks/lm_eval_local.py``, ``benchmarks/server_isolation.py``).
"""

from __future__ import annotations

import atexit
import collections
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

import minengine


def free_port() -> int:
    """A TCP port on 127.0.0.1 that the OS says is free now (bound, read and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env() -> dict:
    """The environment for a child ``python -m minengine``: this process's, with the ``minengine`` it imported
    first on ``PYTHONPATH`` (so the server runs the same code as the notebook) and unbuffered output."""
    root = str(Path(minengine.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1"}


class ServerStartError(RuntimeError):
    """The server did not come up: it exited, or did not answer ``/health`` in time. In a notebook it shows as its
    message alone (``_render_traceback_``, IPython's hook), not as a traceback into this module."""

    def _render_traceback_(self) -> list[str]:
        return [f"ServerStartError: {line}" if i == 0 else line for i, line in enumerate(str(self).splitlines())]


class ServerProcess:
    """``python -m minengine serve ARGS --port PORT`` running in a subprocess on 127.0.0.1.

    Args:
        args: the ``serve`` arguments (model, engine fields).
        timeout_s: how long to wait for ``/health`` (seconds). A first start on a loaded machine can be slow (the
            server loads the model and may build the C++ attention kernel), so the default is long: 540 s, under
            the course tests' 600 s per cell.
        progress_every_s: while waiting, print how long it has been and the server's last output line this often.
        program: the command before ``args`` (default ``python -m minengine serve``; tests pass a stand-in).
        env: variables set for the server on top of this process's environment (e.g. ``{"OMP_NUM_THREADS": "1"}``).
        port: the TCP port to serve on (None: one the OS says is free now).
        wait: wait for ``/health`` before returning (False: the caller calls ``wait_healthy``, e.g. after starting
            several servers that load their models at the same time).

    Attributes:
        url: the base URL, ``http://127.0.0.1:PORT``.
        command: the command line that started it.
        process: the ``subprocess.Popen``.
        output: the server's last output lines (stdout and stderr), read by a thread so the pipe never fills.

    Raises:
        ServerStartError: the server exited before answering, or did not answer within ``timeout_s`` (it is then
            stopped); the message says which, with its last output and what to try.

    The process is terminated at interpreter exit too, so a notebook that stops half-way leaves no server behind.
    """

    def __init__(self, args: list[str], timeout_s: float = 540.0, progress_every_s: float = 20.0,
                 program: list[str] | None = None, env: dict[str, str] | None = None, port: int | None = None,
                 wait: bool = True):
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        program = [sys.executable, "-m", "minengine", "serve"] if program is None else list(program)
        self.command = [*program, *args, "--port", str(self.port), "--uvicorn-log-level", "warning"]
        self.output: collections.deque[str] = collections.deque(maxlen=40)
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**child_env(), **(env or {})})
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()
        atexit.register(self.stop)
        if wait:
            self.wait_healthy(timeout_s, progress_every_s)

    def _read_output(self) -> None:
        for line in self.process.stdout:
            self.output.append(line.rstrip("\n"))

    def _last_output(self, lines: int = 12) -> str:
        tail = list(self.output)[-lines:]
        return "\n".join("    " + line for line in tail) if tail else "    (nothing)"

    def wait_healthy(self, timeout_s: float = 540.0, progress_every_s: float = 20.0) -> None:
        """Until ``/health`` answers 200 (seconds; raises ``ServerStartError`` as the constructor)."""
        start = time.monotonic()
        next_progress = start + progress_every_s
        while True:
            if self.process.poll() is not None:
                self._reader.join(timeout=5)
                raise ServerStartError(f"the server exited with code {self.process.returncode} before answering "
                                       f"/health. Its last output:\n{self._last_output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            now = time.monotonic()
            if now - start > timeout_s:
                self.stop()
                raise ServerStartError(
                    f"the server did not answer /health within {timeout_s:.0f} s (a loaded machine, or a kernel build "
                    f"it waits for). Its last output:\n{self._last_output()}\nRun this cell again (a second start "
                    "loads the built kernel), or set MINENGINE_CPU_KERNEL=0 for the torch attention path.")
            if now >= next_progress:
                last = self.output[-1] if self.output else "no output yet"
                print(f"still starting the server: {now - start:.0f} s so far (last output: {last})", flush=True)
                next_progress = now + progress_every_s
            time.sleep(0.2)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Terminate the server (SIGTERM, then SIGKILL after ``timeout_s``); returns its exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        self._reader.join(timeout=5)  # the output's last lines are read before anyone looks at them
        return self.process.returncode

    def output_text(self) -> str:
        """The server's last output lines (at most 40) as one string."""
        return "\n".join(self.output)

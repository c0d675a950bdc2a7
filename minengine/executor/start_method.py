"""How the worker processes start: fork where it is safe, spawn where it is not (vLLM's rule).

vLLM forks its workers by default (``VLLM_WORKER_MULTIPROC_METHOD``, default "fork"), so a script such as vLLM's
``examples/offline_inference/basic/basic.py``, which calls ``LLM(..., tensor_parallel_size=2)`` at module level
with no ``if __name__ == "__main__":`` guard, works. Spawn would start a fresh interpreter that imports the main
script again, and that import would build another ``LLM`` and start workers of its own. vLLM switches to spawn
when CUDA was initialised in the parent (a forked child cannot use the parent's CUDA context), and its ``vllm``
command line sets spawn for itself (it owns its main module). minengine does the same:

- ``MINENGINE_WORKER_MULTIPROC_METHOD``, else ``VLLM_WORKER_MULTIPROC_METHOD`` (the project's ``MINENGINE_`` name
  wins when both are set): "fork", "spawn" or "forkserver", used as given;
- otherwise "spawn" when CUDA is initialised in this process or the platform cannot fork, else "fork";
- ``minengine serve`` spawns when neither is set, as ``vllm serve`` does (``spawned_workers_unless_set``: a
  server has threads, and forking them is riskier than re-importing minengine's own, guarded, main module).

Spawn (and forkserver, whose server imports the main module too) with a call at the top level of an unguarded
main script would fail in the child with Python's "bootstrapping phase" error, and the driver would only see a
worker die. ``check_main_guard`` finds that case before any process starts: the driver's call stack runs
through the main script's module-level code at a line that no ``if __name__ == "__main__":`` body holds. It
raises ``MainGuardError`` naming the file, the line and the guard.

What fork copies and the workers must not keep (``worker.forked_worker_main``): the driver's ends of the other
workers' pipes (held open, a worker would never see the driver exit), the driver's signal handlers (a server's
SIGTERM handler would keep ``terminate`` from stopping a worker), a CPU-kernel build thread that exists only in
the parent (``layers/cpu_attention.py`` starts over in the child), and the tokenizer's thread pool
(``TOKENIZERS_PARALLELISM=false`` is set before the fork when unset, which is what the tokenizers library does
itself after a fork, there with a warning). torch's OpenMP threads are re-created in the child (the test runs a
TP 1 engine in the parent before forking TP 2 workers).
"""

from __future__ import annotations

import ast
import contextlib
import multiprocessing
import os
import sys
import tokenize

ENV_NAMES = ("MINENGINE_WORKER_MULTIPROC_METHOD", "VLLM_WORKER_MULTIPROC_METHOD")  # the first one set wins
METHODS = ("fork", "spawn", "forkserver")


class MainGuardError(RuntimeError):
    """Workers must be spawned, and the main script would start them again when the spawned child imports it."""


def worker_start_method() -> tuple[str, str]:
    """The start method for worker processes and why it was chosen.

    Returns:
        (method, reason): method one of ``METHODS``; reason a phrase for messages, e.g.
        "VLLM_WORKER_MULTIPROC_METHOD=spawn" or "CUDA is initialised in this process".
    Raises:
        ValueError: an environment variable of ``ENV_NAMES`` holds another value (the message names it).
    """
    for name in ENV_NAMES:
        value = os.environ.get(name, "").strip()
        if value:
            if value not in METHODS:
                raise ValueError(f"{name}={value!r}: the worker start method must be one of {', '.join(METHODS)}")
            return value, f"{name}={value}"
    if _cuda_initialised():
        return "spawn", "CUDA is initialised in this process, and a forked worker cannot use it"
    if "fork" not in multiprocessing.get_all_start_methods():
        return "spawn", "this platform cannot fork"
    return "fork", "the default"


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")  # not imported: nothing initialised CUDA through it
    return bool(torch is not None and torch.cuda.is_initialized())


def check_main_guard(method: str, reason: str) -> None:
    """Refuse to spawn workers from module-level code of an unguarded main script (see the module's docstring).

    Raises:
        MainGuardError: ``method`` is "spawn" or "forkserver" and this call runs, through the stack, from a line of
            the main script's top level outside any ``if __name__ == "__main__":`` body.
    """
    if method == "fork":
        return
    found = unguarded_main_line()
    if found is None:
        return
    path, line = found
    raise MainGuardError(
        f"the worker processes start with {method!r} ({reason}), which imports the main script {path} again in "
        f"each worker, and its line {line} (which starts them) runs at import time: the workers would run it too. "
        f"Put the script's code under an `if __name__ == \"__main__\":` guard, or let the workers fork "
        f"(VLLM_WORKER_MULTIPROC_METHOD=fork, without CUDA initialised before the engine starts).")


def unguarded_main_line() -> tuple[str, int] | None:
    """(path, line) of the main script's top-level line that this call runs under, when no
    ``if __name__ == "__main__":`` body holds it; None otherwise (a guarded line, an interactive session or
    ``python -c``, no script on the stack, or a script whose source cannot be read)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main, "__name__", None) != "__main__":
        return None
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    try:
        with tokenize.open(path) as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    return None if line_is_guarded(tree, frame.f_lineno) else (path, frame.f_lineno)


def line_is_guarded(tree: ast.Module, line: int) -> bool:
    """Whether ``line`` lies in the body (not the ``else``) of an ``if __name__ == "__main__":`` of ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            if node.body[0].lineno <= line <= node.body[-1].end_lineno:
                return True
    return False


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    texts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(texts) == 1


def prepare_fork() -> None:
    """Before forking workers: the tokenizer's thread pool off (``TOKENIZERS_PARALLELISM=false``, unless set)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@contextlib.contextmanager
def spawned_workers_unless_set():
    """Within the block, workers spawn unless ``ENV_NAMES`` say otherwise (``VLLM_WORKER_MULTIPROC_METHOD=spawn``
    while unset, restored after: ``minengine serve`` runs in-process in tests too)."""
    if any(os.environ.get(name, "").strip() for name in ENV_NAMES):
        yield
        return
    os.environ[ENV_NAMES[1]] = "spawn"
    try:
        yield
    finally:
        os.environ.pop(ENV_NAMES[1], None)

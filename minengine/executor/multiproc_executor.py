"""MultiprocExecutor: N worker processes, one per tensor-parallel rank, each running the same steps.

vLLM's multiprocessing executor (``distributed_executor_backend="mp"``): the driver (the engine's process, with the
one scheduler) starts ``tensor_parallel_size`` workers with ``torch.multiprocessing`` (forked, or spawned where
forking is not safe, as vLLM: ``executor/start_method.py``) and a ``torch.distributed.TCPStore`` they rendezvous at;
each worker is a rank of a gloo (CPU) or NCCL (CUDA) process group (``executor/worker.py``). Every step the driver
sends the same encoded ``SchedulerOutput`` (``executor/messages.py``) to every worker over its pipe and waits for
all answers; rank 0's tokens are the step's.

Steps can be pipelined (async scheduling): ``submit`` sends a step without waiting, ``collect`` waits for the
oldest submitted one. The workers run steps in the order they arrive, so a step submitted while another runs
starts as soon as that one ends, and the driver meanwhile schedules the next.

Faults never hang the driver: it waits on the pipes and on every worker's process sentinel at once
(``multiprocessing.connection.wait``), so a worker that raises (it sends its traceback) or dies (its sentinel
fires) ends the wait at once, and a worker that stops answering ends it after ``timeout_s``. Then every worker
is stopped and ``WorkerFailedError`` raised, now and on every later call. ``shutdown`` (also run when the
executor is garbage-collected, and at interpreter exit) asks the workers to stop, then terminates and kills
what is left: no process outlives it.

The NCCL path (``device="cuda"``: rank r on cuda:r, backend nccl) is the same code; it was not run here (no
GPUs on the machine this was written on).
"""

from __future__ import annotations

import collections
import datetime
import time
import weakref
from multiprocessing.connection import wait
from pathlib import Path

from minengine.core.scheduler_output import SchedulerOutput
from minengine.executor.messages import StepEncoder, WorkerReply
from minengine.executor.start_method import check_main_guard, prepare_fork, worker_start_method
from minengine.executor.worker import SHUTDOWN, WorkerConfig, forked_worker_main, plain_config, worker_main

START_TIMEOUT_S = 600.0  # loading a shard, and the CPU attention kernel's first build on a machine
STOP_GRACE_S = 5.0


class WorkerFailedError(RuntimeError):
    """A worker process raised, died or stopped answering; the executor (and its engine) cannot run steps any more."""


class MultiprocExecutor:
    """Runs steps on ``world_size`` worker processes; the ``ModelRunner`` interface plus ``submit``/``collect``.

    Args:
        model_path: the checkpoint directory. hf_config: its config. dtype: "float32" / "float16" / "bfloat16".
        device: "cpu" (backend gloo) or "cuda" (backend nccl, one GPU per rank).
        world_size: ranks (``tensor_parallel_size``; 1 = one worker process, for async scheduling).
        num_blocks, block_size, num_swap_blocks, seed, max_num_seqs: as ``ModelRunner``'s (every rank holds
            all ``num_blocks`` blocks, with its heads' slice of each).
        num_threads: torch threads per worker (CPU).
        timeout_s: longest wait for one step's answers (and the collectives' timeout in the workers).
        kv_cache_dtype, quantization: ``EngineConfig``'s (each worker quantizes its own shard).
        attention_backend: ``EngineConfig``'s (each worker's ``ModelRunner`` resolves it).
        expert_parallel: ``EngineConfig.enable_expert_parallel`` (each worker loads its experts only).

    Attributes:
        device, dtype: where and in what dtype the workers compute (as ``ModelRunner.device`` / ``.dtype``).
        last_logprobs, last_prompt_logprobs, last_swap_time_s: of the last collected step (rank 0's).
        last_replies: every rank's ``WorkerReply`` of the last collected step (all-reduce counts, times).
        start_method: how the workers started: "fork", "spawn" or "forkserver" (``worker_start_method``).

    Raises:
        WorkerFailedError: a worker failed to start (its traceback in the message).
        MainGuardError: the workers must be spawned and the main script has no ``if __name__ == "__main__":``
            guard around the code that starts them (raised before any process starts).
        ValueError: ``VLLM_WORKER_MULTIPROC_METHOD`` (or ``MINENGINE_``) names no start method.
    """

    def __init__(self, model_path: str, hf_config, dtype: str, device: str, world_size: int, num_blocks: int,
                 block_size: int, num_swap_blocks: int = 0, seed: int = 0, max_num_seqs: int = 512,
                 num_threads: int = 1, timeout_s: float = 300.0, kv_cache_dtype: str = "auto",
                 quantization: str | None = None, attention_backend: str = "auto", expert_parallel: bool = False):
        import torch
        import torch.distributed as dist

        import minengine

        self.world_size = world_size
        self.timeout_s = timeout_s
        self.device = torch.device(device)
        self.dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
        self.last_logprobs: dict = {}
        self.last_prompt_logprobs: dict = {}
        self.last_swap_time_s = 0.0
        self.last_replies: list[WorkerReply] = []
        self.start_method, reason = worker_start_method()
        check_main_guard(self.start_method, reason)  # before the store and any process exist
        self._encoder = StepEncoder()
        self._in_flight: collections.deque[int] = collections.deque()
        self._failure: str | None = None
        self._procs, self._conns = [], []
        self._stop = weakref.finalize(self, _stop_workers, self._procs, self._conns)
        # The workers start first and wait for their config: a fork copies only the forking thread, so a lock
        # that another thread held at that moment stays locked in the child forever; the store's thread, which
        # serves the first workers' connections, must not exist yet when the later ones fork.
        self._start_workers()
        # The rendezvous: a store in this process on a port the OS picks (no race for a free port).
        self._store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        config = WorkerConfig(model_path=str(model_path), hf_config=plain_config(hf_config), dtype=dtype, device=device,
                              backend="nccl" if device == "cuda" else "gloo", store_host="127.0.0.1",
                              store_port=self._store.port, world_size=world_size, num_blocks=num_blocks,
                              block_size=block_size, num_swap_blocks=num_swap_blocks, seed=seed,
                              max_num_seqs=max_num_seqs, num_threads=num_threads, timeout_s=timeout_s,
                              kv_cache_dtype=kv_cache_dtype, quantization=quantization,
                              attention_backend=attention_backend, expert_parallel=expert_parallel,
                              minengine_dir=str(Path(minengine.__file__).resolve().parent))
        for conn in self._conns:
            try:
                conn.send(config)
            except OSError:  # a worker that died already: its exit code says why
                self._fail_dead("start")
        self._wait_all(lambda msg: msg is None, START_TIMEOUT_S, "start")

    def _start_workers(self) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context(self.start_method)
        if self.start_method == "fork":
            prepare_fork()
        for rank in range(self.world_size):
            parent, child = ctx.Pipe(duplex=True)
            # a forked worker closes its copies of the driver's pipe ends (this one's and the earlier workers')
            target, args = ((forked_worker_main, (rank, child, [*self._conns, parent]))
                            if self.start_method == "fork" else (worker_main, (rank, child)))
            proc = ctx.Process(target=target, args=args, name=f"minengine-worker-{rank}", daemon=True)
            proc.start()
            child.close()  # the worker's end lives in the worker only: its death closes the pipe
            self._procs.append(proc)
            self._conns.append(parent)

    # ---- the ModelRunner interface ----------------------------------------------------------------------------
    def execute(self, scheduler_output: SchedulerOutput) -> dict[str, list[int]]:
        """Run one step on every rank and wait for it: {request id: tokens}, as ``ModelRunner.execute``.

        Raises:
            WorkerFailedError: a worker raised, died or timed out (the executor is then stopped).
        """
        self.submit(scheduler_output)
        return self.collect()

    def submit(self, scheduler_output: SchedulerOutput) -> None:
        """Send a step to every worker without waiting for it (it runs after the steps already submitted)."""
        self._check_alive()
        step_id, data = self._encoder.encode(scheduler_output)
        for conn in self._conns:
            try:
                conn.send_bytes(data)
            except OSError:  # a dead worker's pipe: find out which and why
                self._fail_dead(f"step {step_id}")
        self._in_flight.append(step_id)

    def collect(self) -> dict[str, list[int]]:
        """Wait for the oldest submitted step; returns its tokens and sets the ``last_*`` attributes.

        Raises:
            WorkerFailedError: as ``execute``; RuntimeError: no step in flight.
        """
        self._check_alive()
        if not self._in_flight:
            raise RuntimeError("collect() without a submitted step")
        step_id = self._in_flight.popleft()
        replies = self._wait_all(lambda msg: isinstance(msg, WorkerReply) and msg.step_id == step_id,
                                 self.timeout_s, f"step {step_id}")
        if len({r.digest for r in replies}) > 1:
            self._fail(f"step {step_id}: the ranks sampled different tokens (their logits differ)")
        first = replies[0]
        self.last_replies = replies
        self.last_logprobs, self.last_prompt_logprobs = first.logprobs, first.prompt_logprobs
        self.last_swap_time_s = first.swap_time_s
        return first.sampled

    @property
    def num_in_flight(self) -> int:
        """Steps submitted and not yet collected."""
        return len(self._in_flight)

    @property
    def is_alive(self) -> bool:
        return self._failure is None and self._stop.alive

    def shutdown(self) -> None:
        """Stop every worker (graceful, then terminate, then kill), then the store's thread; idempotent."""
        self._stop()
        self._store = None

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # ---- waiting without hanging ------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._failure is not None:
            raise WorkerFailedError(f"the engine's worker processes are stopped: {self._failure}")
        if not self._stop.alive:
            raise WorkerFailedError("the executor was shut down")

    def _wait_all(self, expected, timeout_s: float, what: str) -> list:
        """One message from every rank, each checked with ``expected(payload)``, within ``timeout_s``."""
        replies: list = [None] * self.world_size
        pending = set(range(self.world_size))
        deadline = time.monotonic() + timeout_s
        sentinels = {p.sentinel: rank for rank, p in enumerate(self._procs)}
        while pending:
            ready = wait([self._conns[r] for r in pending] + list(sentinels), max(0.0, deadline - time.monotonic()))
            if not ready:
                self._fail(f"{what}: no answer from worker(s) {sorted(pending)} within {timeout_s:g} s")
            for rank in sorted(pending):
                conn = self._conns[rank]
                if conn not in ready:
                    continue
                try:
                    kind, _, payload = conn.recv()
                except (EOFError, OSError):  # closed: the worker died; its sentinel says how
                    self._fail_dead(what)
                if kind == "error":
                    self._fail(f"{what}: worker {rank} raised:\n{self._with_other_errors(payload, rank)}")
                if not expected(payload):
                    self._fail(f"{what}: worker {rank} sent an unexpected message ({kind}, {payload!r:.200})")
                replies[rank] = payload
                pending.discard(rank)
            if any(s in ready for s in sentinels):
                self._fail_dead(what)
        return replies

    def _with_other_errors(self, first: str, rank: int) -> str:
        """``first`` plus what the other workers reported by now (a peer's failure makes the others raise too)."""
        texts = [first]
        time.sleep(0.2)
        for r, conn in enumerate(self._conns):
            if r != rank and conn.poll(0):
                try:
                    kind, _, payload = conn.recv()
                except (EOFError, OSError):
                    continue
                if kind == "error":
                    texts.append(f"(worker {r} then raised:\n{payload})")
        return "\n".join(texts)

    def _fail_dead(self, what: str) -> None:
        wait([p.sentinel for p in self._procs], 1.0)  # a closed pipe may come a moment before the exit code
        dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if not p.is_alive()]
        errors = []
        for r, conn in enumerate(self._conns):  # a worker that raised sends its traceback before it exits
            try:
                if conn.poll(0):
                    kind, _, payload = conn.recv()
                    if kind == "error":
                        errors.append(f"worker {r} raised:\n{payload}")
            except (EOFError, OSError):
                continue
        codes = ", ".join(f"worker {r} exit code {code}" for r, code in dead)
        self._fail(f"{what}: worker process died ({codes})" + ("\n" + "\n".join(errors) if errors else ""))

    def _fail(self, reason: str):
        self._failure = reason
        self._in_flight.clear()
        self._stop.detach()
        _stop_workers(self._procs, self._conns, graceful=False)
        raise WorkerFailedError(reason)


def _stop_workers(procs: list, conns: list, graceful: bool = True) -> None:
    """Stop the workers: ask (``graceful``), wait up to ``STOP_GRACE_S``, terminate, kill. Never raises."""
    if graceful:
        for conn in conns:
            try:
                conn.send_bytes(SHUTDOWN)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join()
    for conn in conns:
        conn.close()

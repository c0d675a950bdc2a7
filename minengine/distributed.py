"""Tensor-parallel setup: the worker's process group, its all-reduce (counted), and the checks a
``tensor_parallel_size`` must pass before any process is started.

Megatron-LM (Shoeybi et al., 2019, section 3) splits each transformer layer over ``tp`` devices so that a
layer needs two all-reduces of its ``[tokens, hidden]`` activations in the forward pass: one after the
attention's output projection, one after the MLP's down projection (``layers/linear.py``). Each worker
process is one rank of a ``torch.distributed`` process group: backend ``gloo`` on the CPU (the collectives run
between processes over loopback TCP, the same calls NCCL runs between GPUs) and ``nccl`` on CUDA (one GPU per
rank). The group is an object passed to the layers that need it, never a module-level global.

Also vLLM's ``cleanup_dist_env_and_memory``, for scripts that call it between engines.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import math
import os
from dataclasses import dataclass, field


def cleanup_dist_env_and_memory(shutdown_ray: bool = False) -> None:
    """Collect garbage and return cached CUDA memory (``shutdown_ray`` is accepted and ignored). The driver
    holds no process group (only the workers do, and ``LLMEngine.shutdown`` ends them), so there is none
    to destroy here."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class TensorParallelGroup:
    """One rank's view of the tensor-parallel group, with a count of the all-reduces it ran.

    Attributes:
        rank, world_size: this process's rank in ``0 .. world_size - 1``.
        process_group: the ``torch.distributed`` group (None for world size 1: every collective is a no-op).
        num_all_reduces, all_reduce_bytes: all-reduces since the last ``reset_counters`` and the bytes of the
            tensors they reduced (elements x element size; what a ring all-reduce sends per rank is
            ``2 (tp - 1) / tp`` of that); the worker resets them every step and reports them
            (``executor/worker.py``), and a test compares them with what ``StepCostModel`` charges.
        num_all_gathers, all_gather_bytes: the same for all-gathers (the LM head's logits); the bytes are those
            of the gathered result (every rank's tensor).
        num_all_to_alls, all_to_all_bytes: the same for all-to-alls (expert parallelism's dispatch and combine,
            ``layers/expert_parallel.py``); the bytes are those this rank sent to the other ranks (what it keeps
            for itself does not travel), so they differ between ranks.
        expert_loads: per MoE layer run since the reset, the (token, expert) pairs this rank routed to each
            expert (E counts); they set the all-to-alls' sizes (``timing/expert_parallel.py`` prices them).
    """

    rank: int = 0
    world_size: int = 1
    process_group: object | None = field(default=None, repr=False)
    num_all_reduces: int = 0
    all_reduce_bytes: int = 0
    num_all_gathers: int = 0
    all_gather_bytes: int = 0
    num_all_to_alls: int = 0
    all_to_all_bytes: int = 0
    expert_loads: list = field(default_factory=list)
    last_work: object | None = field(default=None, repr=False)

    def _finish(self, work) -> None:
        """Wait for a collective (the GIL released meanwhile) and hold its ``Work`` from then on: a gloo thread
        that drops the last reference to a ``Work`` frees its tensors, which needs the GIL; after the last
        collective before the interpreter finalises, such a thread is killed waiting for the GIL and the process
        aborts ("terminate called without an active exception"; pytorch/pytorch#190489). Held here, only the
        main thread frees it (when the next collective replaces it, or with this object)."""
        work.wait()
        self.last_work = work

    def all_reduce(self, x):
        """Sum ``x`` (any shape, any float dtype) over the ranks, in place; returns ``x``. No-op at world size 1.

        Sums of floats in another order differ in the last bits: a tensor-parallel forward is not bit-identical
        to the single-device one (the tests allow a differing greedy token only at a near-tie)."""
        if self.world_size == 1:
            return x
        import torch.distributed as dist

        self._finish(dist.all_reduce(x, group=self.process_group, async_op=True))
        self.num_all_reduces += 1
        self.all_reduce_bytes += x.numel() * x.element_size()
        return x

    def all_gather(self, x) -> list:
        """Every rank's ``x`` (the same shape and dtype on every rank), in rank order: ``world_size`` tensors.
        ``[x]`` at world size 1."""
        if self.world_size == 1:
            return [x]
        import torch
        import torch.distributed as dist

        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self._finish(dist.all_gather(parts, x, group=self.process_group, async_op=True))
        self.num_all_gathers += 1
        self.all_gather_bytes += self.world_size * x.numel() * x.element_size()
        return parts

    def all_to_all(self, x, send_rows: list[int], recv_rows: list[int]):
        """Send rows ``x[sum(send_rows[:j]) : sum(send_rows[:j + 1])]`` to rank j; returns the rows received,
        rank 0's first: ``[sum(recv_rows), *x.shape[1:]]``, ``recv_rows[j]`` from rank j (which must be what
        rank j sends here). ``x`` [sum(send_rows), ...] any dtype; at world size 1 ``x`` itself."""
        if self.world_size == 1:
            return x
        import torch.distributed as dist

        x = x.contiguous()
        out = x.new_empty((sum(recv_rows), *x.shape[1:]))
        self._finish(dist.all_to_all_single(out, x, recv_rows, send_rows, group=self.process_group, async_op=True))
        row_bytes = math.prod(x.shape[1:]) * x.element_size()  # also for a rank that sends no row
        self.num_all_to_alls += 1
        self.all_to_all_bytes += (sum(send_rows) - send_rows[self.rank]) * row_bytes
        return out

    def all_reduce_max(self, x):
        """The elementwise maximum of ``x`` over the ranks, in place; returns ``x`` (load time: not counted)."""
        if self.world_size > 1:
            import torch.distributed as dist

            self._finish(dist.all_reduce(x, op=dist.ReduceOp.MAX, group=self.process_group, async_op=True))
        return x

    def destroy(self) -> None:
        """Destroy the process group, if one is initialised (torch asks for it before a process ends; a worker
        calls it when it stops, ``init_env_group`` at exit for the group it made). ``last_work`` stays held (see
        ``_finish``). Collectives after it fail."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def reset_counters(self) -> None:
        self.num_all_reduces = self.all_reduce_bytes = self.num_all_gathers = self.all_gather_bytes = 0
        self.num_all_to_alls = self.all_to_all_bytes = 0
        self.expert_loads = []

    def shard_range(self, size: int) -> tuple[int, int]:
        """This rank's ``[start, end)`` of ``size`` items split as evenly as possible (the first ``size % tp``
        ranks get one more): the vocabulary of the LM head, which need not divide by ``tp``."""
        base, extra = divmod(size, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)


def kv_heads_of_rank(num_kv_heads: int, tp: int, rank: int) -> tuple[int, int]:
    """(first KV head, number of KV heads) that ``rank`` of ``tp`` holds, as vLLM's ``QKVParallelLinear``.

    With ``tp <= num_kv_heads`` the KV heads are split evenly (``num_kv_heads / tp`` each). With more ranks
    than KV heads each rank holds one, replicated on ``tp / num_kv_heads`` consecutive ranks: rank r's query
    heads ``r x H / tp ..`` belong to the group of KV head ``r / (tp / num_kv_heads)``, so grouped-query attention
    needs no head from another rank. Either way a KV block of the scheduler is on every rank, holding that
    rank's heads (its bytes per block are ``num_kv_heads of the rank / num_kv_heads`` of the whole block's)."""
    if tp <= num_kv_heads:
        per_rank = num_kv_heads // tp
        return rank * per_rank, per_rank
    return rank // (tp // num_kv_heads), 1


def init_worker_group(backend: str, store_host: str, store_port: int, rank: int, world_size: int,
                      timeout_s: float) -> TensorParallelGroup:
    """Join the process group of a tensor-parallel engine (called in each worker process).

    The driver holds a ``TCPStore`` (it picked a free port, so there is no race for one); the workers join it
    as clients and rendezvous there. ``timeout_s`` bounds every collective (a peer that stops answering makes
    the others raise instead of waiting forever); the driver watches the workers with its own, shorter checks.

    Raises:
        RuntimeError: as ``torch.distributed.init_process_group`` (a peer never joined, a timeout).
    """
    import torch.distributed as dist

    if backend == "gloo":
        # All ranks run on this machine (the multiprocessing executor starts them): rendezvous over loopback,
        # whatever the host name resolves to.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(store_host, store_port, world_size=None, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return TensorParallelGroup(rank=rank, world_size=world_size, process_group=dist.group.WORLD)


ENV_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")  # torchrun's contract (env://)


def init_env_group(world_size: int, backend: str, timeout_s: float) -> TensorParallelGroup:
    """Join a process group through torch.distributed's standard rendezvous (``init_method="env://"``): the
    variables ``MASTER_ADDR``, ``MASTER_PORT`` (rank 0's host and a free port there), ``WORLD_SIZE`` and ``RANK``,
    as ``torchrun`` sets them or as a person exports them on each machine. Every rank is a whole engine
    (vLLM's ``distributed_executor_backend="external_launcher"``); the ranks may be on different hosts, so no
    socket interface is forced (``GLOO_SOCKET_IFNAME`` picks one where the default route is not the right one).
    A group the launcher's script already initialised is reused.

    Raises:
        ValueError: a variable missing or not an integer where one is needed, ``WORLD_SIZE`` other than
            ``world_size`` (the engine's ``tensor_parallel_size``), ``RANK`` outside ``0 .. WORLD_SIZE - 1``.
        RuntimeError: as ``torch.distributed.init_process_group`` (a peer never joined within ``timeout_s``).
    """
    import torch.distributed as dist

    missing = [name for name in ENV_RENDEZVOUS if not os.environ.get(name)]
    if missing:
        raise ValueError(f"distributed_executor_backend='external_launcher' joins through the env:// rendezvous: "
                         f"set {', '.join(missing)} (torchrun sets them all)")
    values = {}
    for name in ("MASTER_PORT", "WORLD_SIZE", "RANK"):
        try:
            values[name] = int(os.environ[name])
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {os.environ[name]!r}") from None
    if values["WORLD_SIZE"] != world_size:
        raise ValueError(f"WORLD_SIZE ({values['WORLD_SIZE']}) must equal tensor_parallel_size ({world_size}): "
                         f"every rank of the group holds one shard")
    if not 0 <= values["RANK"] < world_size:
        raise ValueError(f"RANK must be in 0..{world_size - 1}, got {values['RANK']}")
    if dist.is_initialized():  # the launcher's script made the group: its teardown is the script's
        return TensorParallelGroup(dist.get_rank(), dist.get_world_size(), dist.group.WORLD)
    dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))
    group = TensorParallelGroup(dist.get_rank(), dist.get_world_size(), dist.group.WORLD)
    atexit.register(group.destroy)
    return group


def available_cpu_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def check_cpu_cores(tp: int, allow_cpu_oversubscription: bool = False) -> None:
    """Refuse more CPU ranks than cores (see ``check_tensor_parallel_size``). Raises ``ValueError``."""
    cores = available_cpu_cores()
    if tp > cores and not allow_cpu_oversubscription:
        raise ValueError(f"tensor_parallel_size ({tp}) exceeds the {cores} CPU cores this process may use: each "
                         f"rank is a process that needs its own core (allow_cpu_oversubscription=True runs it "
                         f"anyway, for correctness tests: every collective then waits for a descheduled rank)")


def check_tensor_parallel_size(tp: int, hf_config, device: str, allow_cpu_oversubscription: bool = False) -> None:
    """Check that ``tp`` ranks can split this model on this machine, before any worker starts.

    Query heads and the MLP's intermediate size must divide by ``tp``; KV heads must divide by ``tp``, or
    ``tp`` by them (then every rank holds one KV head and ``tp / num_kv_heads`` ranks hold the same one, as
    vLLM replicates them). On the CPU each rank is a process with its own core: ``tp`` above the cores this
    process may use would oversubscribe them (every collective then waits for a descheduled peer), and is
    refused unless ``allow_cpu_oversubscription`` (correctness tests of TP 4 on a 2-core machine). On CUDA each
    rank needs its own GPU.

    Raises:
        ValueError: naming ``tensor_parallel_size`` and the limit it breaks.
    """
    if tp == 1:
        return
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if heads % tp:
        raise ValueError(f"tensor_parallel_size ({tp}) must divide the model's num_attention_heads ({heads})")
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(f"tensor_parallel_size ({tp}) must divide the model's num_key_value_heads ({kv_heads}) "
                         f"or be a multiple of it (KV heads are then replicated)")
    if hf_config.intermediate_size % tp:
        raise ValueError(f"tensor_parallel_size ({tp}) must divide the model's intermediate_size "
                         f"({hf_config.intermediate_size})")
    if device == "cpu":
        check_cpu_cores(tp, allow_cpu_oversubscription)
    elif device == "cuda":
        import torch

        if tp > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size ({tp}) exceeds the {torch.cuda.device_count()} visible CUDA "
                             f"devices (one GPU per rank)")

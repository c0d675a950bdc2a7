"""The tensor-parallel worker process: one rank, its shard of the weights and of every KV block, a loop of steps.

Started by ``MultiprocExecutor`` (``torch.multiprocessing``: forked, ``forked_worker_main``, or spawned,
``worker_main``; ``executor/start_method.py``). It reads its ``WorkerConfig`` from its pipe (the driver sends
it once every worker has started), joins the process group, loads its shard
(``load_model(..., tp=group)``), builds an ordinary ``ModelRunner`` on it (the shard's KV heads set the KV
tensors' shape: each rank holds its heads' slice of every block), tells the driver it is ready, then runs
every step the driver sends, in order: decode the message, ``ModelRunner.execute`` (the model's all-reduces
happen inside), answer. Every rank samples (the logits are all-reduced, so the same on every rank); rank 0
sends the tokens, the others a digest the driver compares.

Faults: an exception in a step is sent to the driver as text and the process exits (its peers may be inside a
collective it will never join; the driver ends them). The end of the driver's pipe (the driver died, or
shut the executor down) ends the loop. SIGINT is ignored: Ctrl-C in a terminal reaches the whole process group,
and it is the driver that decides what a Ctrl-C means.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from types import SimpleNamespace

SHUTDOWN = b"shutdown"


def plain_config(hf_config):
    """``hf_config`` (a transformers config) as a ``SimpleNamespace`` of its ``to_dict()``, which a worker
    unpickles without importing transformers (a large part of a worker's start); the config itself when
    something may need transformers' class: a scaled RoPE (``layers/rotary.py`` hands the config to
    transformers' initialisers) or an ``attribute_map`` (aliases)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    if (params.get("rope_type", params.get("type", "default")) != "default" or getattr(hf_config, "attribute_map", None)
            or not hasattr(hf_config, "to_dict")):
        return hf_config
    return SimpleNamespace(**hf_config.to_dict())


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs to start (picklable).

    Attributes:
        model_path: the resolved checkpoint directory. hf_config: its config (the driver's, ``plain_config``).
        dtype: "float32" / "float16" / "bfloat16". device: "cpu" or "cuda" (rank r takes cuda:r).
        backend: "gloo" or "nccl". store_host, store_port: the driver's ``TCPStore``.
        world_size: ranks. num_blocks, block_size, num_swap_blocks, seed, max_num_seqs: the ``ModelRunner``'s.
        num_threads: torch intra-op threads of this process (CPU). timeout_s: the collectives' timeout.
        minengine_dir: the driver's ``minengine`` package directory; a worker that imported another copy
            (a different ``sys.path``) refuses to start.
        kv_cache_dtype, quantization, attention_backend: ``EngineConfig``'s ("auto" / "fp8"; None / "int8";
            "auto" / "reference" / "cpu" / "triton").
        expert_parallel: ``EngineConfig.enable_expert_parallel`` (the worker loads its experts only).
    """

    model_path: str
    hf_config: object
    dtype: str
    device: str
    backend: str
    store_host: str
    store_port: int
    world_size: int
    num_blocks: int
    block_size: int
    num_swap_blocks: int
    seed: int
    max_num_seqs: int
    num_threads: int
    timeout_s: float
    minengine_dir: str
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    attention_backend: str = "auto"
    expert_parallel: bool = False


def worker_main(rank: int, conn) -> None:
    """The worker process (``conn``: its end of the driver's pipe, on which its ``WorkerConfig`` comes first). It
    ends with ``os._exit``: an interpreter with torch loaded can take seconds to tear itself down, and a worker
    has nothing to save (what it sent is in the pipe already)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 1
    try:
        try:
            config = conn.recv()
            runner, group = _start(rank, config)
        except BaseException:
            conn.send(("error", rank, traceback.format_exc()))
            return
        conn.send(("ready", rank, None))
        code = 0 if _serve(rank, runner, group, conn) else 1
        if code == 0:
            group.destroy()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def forked_worker_main(rank: int, conn, driver_conns: list) -> None:
    """``worker_main`` in a forked child. The fork copied the driver's ends of the pipes (``driver_conns``): held
    here, they would keep this worker's own pipe open after the driver exits, so it would never see the driver
    go; closed first. SIGTERM back to its default, in case the driver had a handler (a server's)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for driver_end in driver_conns:
        driver_end.close()
    worker_main(rank, conn)


def _start(rank: int, config: WorkerConfig):
    from pathlib import Path

    import torch

    import minengine
    from minengine.distributed import TensorParallelGroup, init_worker_group

    here = str(Path(minengine.__file__).resolve().parent)
    if here != config.minengine_dir:
        raise RuntimeError(f"the worker imported minengine from {here}, the driver from {config.minengine_dir}: "
                           f"start the driver with the same sys.path / PYTHONPATH")
    torch.set_num_threads(config.num_threads)
    device = config.device
    if device == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    if config.world_size > 1:
        group = init_worker_group(config.backend, config.store_host, config.store_port, rank, config.world_size,
                                  config.timeout_s)
    else:  # one worker process (async scheduling at world size 1): no collective to run
        group = TensorParallelGroup()
    from minengine.layers.kv_quant import kv_cache_torch_dtype
    from minengine.models.loader import load_model
    from minengine.worker.model_runner import ModelRunner

    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[config.dtype]
    model, _, _ = load_model(config.model_path, dtype, device, quantization=config.quantization, tp=group,
                             hf_config=config.hf_config, expert_parallel=config.expert_parallel)
    # No CUDA graphs with tp > 1: a replayed graph would not run the Python all-reduce counters, and NCCL
    # collectives inside captured graphs are not tested here. Worker processes run every step eagerly (no
    # ``torch.compile``: worker/compiled_decode.py takes one process with the whole model).
    runner = ModelRunner(model, config.num_blocks, config.block_size, seed=config.seed,
                         num_swap_blocks=config.num_swap_blocks, max_num_seqs=config.max_num_seqs,
                         cuda_graphs=False if config.world_size > 1 else None,
                         kv_cache_dtype=kv_cache_torch_dtype(config.kv_cache_dtype, dtype),
                         attention_backend=config.attention_backend, enforce_eager=True)
    return runner, group


def _serve(rank: int, runner, group, conn) -> bool:
    """Run steps until the driver says stop or goes away (True), or a step raises (False)."""
    from minengine.executor.messages import StepDecoder, WorkerReply, tokens_digest

    decoder = StepDecoder()
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):  # the driver is gone
            return True
        if data == SHUTDOWN:
            return True
        step_id = -1
        try:
            t0 = time.monotonic()
            step_id, scheduler_output = decoder.decode(data)
            group.reset_counters()
            sampled = runner.execute(scheduler_output)
            decoder.record(sampled)
            reply = WorkerReply(step_id, rank, sampled if rank == 0 else None, tokens_digest(sampled),
                                runner.last_logprobs if rank == 0 else {},
                                runner.last_prompt_logprobs if rank == 0 else {}, runner.last_swap_time_s,
                                group.num_all_reduces, group.all_reduce_bytes, group.num_all_gathers,
                                group.all_gather_bytes, group.num_all_to_alls, group.all_to_all_bytes,
                                group.expert_loads)
            reply.started_at, reply.finished_at = t0, time.monotonic()
            reply.execute_time_s = reply.finished_at - t0
        except BaseException:
            conn.send(("error", rank, f"step {step_id}: {traceback.format_exc()}"))
            return False
        conn.send(("ok", rank, reply))

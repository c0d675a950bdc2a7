"""How a ``SchedulerOutput`` reaches the model: in this process, or on N worker processes.

The executor interface is the ``ModelRunner``'s, so the engine (and its one scheduler) never knows which runs:

    execute(scheduler_output) -> {request_id: sampled tokens}
    last_logprobs, last_prompt_logprobs, last_swap_time_s     (of the last step)
    device, dtype

- ``"uni"`` (world size 1, no async scheduling; the default then): the ``ModelRunner`` itself, in the engine's
  process: today's path, nothing in between.
- ``"mp"`` (``MultiprocExecutor``; the default for ``tensor_parallel_size > 1`` or ``async_scheduling``): N worker
  processes, one per tensor-parallel rank, over ``torch.distributed`` (gloo on CPU, NCCL on CUDA). It adds
  ``submit`` / ``collect`` (a step sent without waiting, so the driver schedules the next one meanwhile: async
  scheduling), ``shutdown``, and ``last_replies`` (per rank: all-reduces run, seconds in the worker).

- ``"external_launcher"`` (vLLM's name): the ``ModelRunner`` in this process on this rank's shard; the process
  is one rank of a group that ``torchrun`` (or a person, on each machine) started, joined through the env://
  rendezvous (``distributed.init_env_group``, from ``engine/model_setup.py``). Every rank runs its own engine.

vLLM's names: ``distributed_executor_backend="mp"`` / ``"uni"`` (``UniProcExecutor``) / ``"external_launcher"``.
"""

from __future__ import annotations

from minengine.executor.multiproc_executor import MultiprocExecutor, WorkerFailedError
from minengine.executor.start_method import MainGuardError

__all__ = ["MainGuardError", "MultiprocExecutor", "WorkerFailedError", "executor_backend", "make_executor"]


def executor_backend(config) -> str:
    """"uni", "mp" or "external_launcher": ``config.distributed_executor_backend``, or when None the default for
    the config."""
    if config.distributed_executor_backend == "external_launcher":
        return "external_launcher"
    return "mp" if config.uses_worker_processes else "uni"


def _runner_class(hf_config) -> type:
    """``ModelRunner``, or for a model with two KV cache groups (full-attention and windowed layers,
    ``models/layer_windows.hybrid_window``) the ``HybridModelRunner``, which reads each group's block tables."""
    from minengine.models.layer_windows import hybrid_window
    from minengine.worker.model_runner import ModelRunner

    if hybrid_window(hf_config) is None:
        return ModelRunner
    from minengine.worker.hybrid_model_runner import HybridModelRunner

    return HybridModelRunner


def make_executor(config, model, hf_config, model_path, device: str, num_blocks: int, num_swap_blocks: int,
                  num_threads: int, kv_cache_dtype=None, logits_processors=None):
    """The executor for an engine: a ``ModelRunner`` on ``model`` ("uni"), or a ``MultiprocExecutor`` whose
    workers load ``model_path`` themselves ("mp"; ``model`` is then None: the driver holds no weights), with
    ``config.quantization`` and ``config.kv_cache_dtype`` (``kv_cache_dtype``: its torch dtype, for "uni");
    ``logits_processors``: the engine's ``CustomLogitsProcessors`` ("uni" only: ``EngineConfig`` refuses them
    with "mp").

    Raises:
        WorkerFailedError: a worker failed to start.
        MainGuardError: workers must be spawned from an unguarded main script (``executor/start_method.py``).
    """
    if executor_backend(config) != "mp":  # "external_launcher": ``model`` is this rank's shard
        runner_class = _runner_class(hf_config)
        return runner_class(model, num_blocks, config.block_size, seed=config.seed, num_swap_blocks=num_swap_blocks,
                            max_num_seqs=config.max_num_seqs, kv_cache_dtype=kv_cache_dtype,
                            logits_processors=logits_processors, attention_backend=config.attention_backend,
                            enforce_eager=config.enforce_eager)
    return MultiprocExecutor(model_path, hf_config, config.dtype, device, config.tensor_parallel_size, num_blocks,
                             config.block_size, num_swap_blocks=num_swap_blocks, seed=config.seed,
                             max_num_seqs=config.max_num_seqs, num_threads=num_threads,
                             timeout_s=config.execute_model_timeout_s, kv_cache_dtype=config.kv_cache_dtype,
                             quantization=config.quantization, attention_backend=config.attention_backend,
                             expert_parallel=config.enable_expert_parallel)

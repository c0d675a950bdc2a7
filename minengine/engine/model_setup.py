"""What ``LLMEngine`` loads before it can schedule: the model and tokenizer (or, with worker processes, only
the checkpoint's config), the KV bytes per block they imply, the KV cache manager the model's attention asks for,
custom logits processors, the worker threads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from minengine.config import EngineConfig
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.worker.kv_pool import KVPoolSize

if TYPE_CHECKING:
    from minengine.core.hybrid_kv_cache_manager import HybridKVCacheManager


@dataclass
class LoadedModel:
    """The model of an ``EngineConfig``: ``model`` None when worker processes hold it (each loads its shard) or
    the engine is model-free; ``device`` resolved ("cpu" / "cuda"; None model-free); ``kv_bytes_per_block`` of
    one rank; ``kv_cache_dtype`` a torch dtype."""

    model: object
    hf_config: object
    model_path: str
    tokenizer: object
    device: str
    kv_bytes_per_block: int
    kv_cache_dtype: object


def load_model(config: EngineConfig, runner=None) -> LoadedModel:
    """Load the model and tokenizer of ``config`` (with worker processes, ``minengine.executor`` "mp", only
    its config and tokenizer: each worker loads its own shard). With a model-free ``runner`` nothing is loaded:
    its ``model_config`` and ``kv_bytes_per_block``, no device, and its ``tokenizer`` if it has one (the host
    benchmark's runner brings one, so the engine detokenizes).

    Raises:
        ValueError: ``device="cuda"`` without a CUDA device; a checkpoint or tokenizer that cannot be used.
    """
    if runner is not None:
        return LoadedModel(None, runner.model_config, None, getattr(runner, "tokenizer", None), None,
                           runner.kv_bytes_per_block(config.block_size), None)
    import torch

    from minengine.executor import executor_backend
    from minengine.layers.kv_quant import kv_cache_torch_dtype
    from minengine.models.loader import load_model, load_tokenizer
    from minengine.worker.kv_pool import kv_bytes_per_block

    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[config.dtype]
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA device")
    if device == "cpu" and config.num_cpu_threads is not None:
        torch.set_num_threads(config.num_cpu_threads)  # process-wide; see EngineConfig.num_cpu_threads
    kv_dtype = kv_cache_torch_dtype(config.kv_cache_dtype, dtype)  # fp8: 1 byte per element
    backend = executor_backend(config)
    if backend == "mp":
        return _read_model_config(config, device, kv_dtype)
    group = _env_group(config, device) if backend == "external_launcher" else None
    model, hf_config, model_path = load_model(config.model, dtype, device, config.revision,
                                              config.trust_remote_code, config.quantization, tp=group,
                                              expert_parallel=config.enable_expert_parallel)
    tokenizer = load_tokenizer(config.tokenizer or model_path, required=config.tokenizer is not None,
                               revision=config.revision if config.tokenizer else None,
                               trust_remote_code=config.trust_remote_code)
    return LoadedModel(model, hf_config, model_path, tokenizer, device,
                       kv_bytes_per_block(model, config.block_size, kv_dtype), kv_dtype)


def _env_group(config: EngineConfig, device: str):
    """This process's rank of an external launcher's group (env:// rendezvous; gloo on the CPU, nccl on CUDA,
    where rank r takes the machine's GPU ``LOCAL_RANK``, torchrun's variable, else 0).

    Raises:
        ValueError: the rendezvous variables are missing or do not fit ``tensor_parallel_size``.
    """
    import os

    import torch

    from minengine.distributed import init_env_group

    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return init_env_group(config.tensor_parallel_size, "nccl" if device == "cuda" else "gloo",
                          config.execute_model_timeout_s)


def _read_model_config(config: EngineConfig, device: str, kv_cache_dtype) -> LoadedModel:
    """The driver's side of worker processes: the checkpoint's config and tokenizer, no weights; the KV bytes
    per block are one rank's (its KV heads: ``distributed.kv_heads_of_rank``)."""
    from minengine.distributed import check_tensor_parallel_size, kv_heads_of_rank
    from minengine.models.llama import _head_dim
    from minengine.models.loader import check_model_config, load_config, load_tokenizer, resolve_model_path

    model_path = resolve_model_path(config.model, config.revision)
    cfg = load_config(model_path, config.trust_remote_code)
    tp = config.tensor_parallel_size
    check_model_config(cfg, model_path, tp, config.quantization, config.enable_expert_parallel)
    check_tensor_parallel_size(tp, cfg, device, config.allow_cpu_oversubscription)
    tokenizer = load_tokenizer(config.tokenizer or model_path, required=config.tokenizer is not None,
                               revision=config.revision if config.tokenizer else None,
                               trust_remote_code=config.trust_remote_code)
    _, kv_heads = kv_heads_of_rank(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads, tp, 0)
    bytes_per_block = (2 * cfg.num_hidden_layers * config.block_size * kv_heads * _head_dim(cfg)
                       * kv_cache_dtype.itemsize)
    return LoadedModel(None, cfg, model_path, tokenizer, device, bytes_per_block, kv_cache_dtype)


def make_kv_cache_manager(config: EngineConfig, num_blocks: int, hf_config) -> KVCacheManager | HybridKVCacheManager:
    """The KV cache manager of the engine: a ``KVCacheManager``; when every layer of the model attends through a
    sliding window (``models/layer_windows.kv_window``), a ``WindowedKVCacheManager``
    (``core/windowed_kv_cache_manager.py``), which frees the blocks behind the window as requests advance; when
    the model mixes full-attention and windowed layers (``layer_windows.hybrid_window``), a
    ``HybridKVCacheManager`` (``core/hybrid_kv_cache_manager.py``): one block table per KV cache group, the
    windowed group's freed behind its window.

    Raises:
        ValueError: a model with a windowed layer and ``attention_backend="triton"`` (the kernel takes no window);
            a windowed model with ``preemption_mode="swap"`` or ``async_scheduling`` (neither is built for tables
            with released blocks); a mixed model with ``tensor_parallel_size`` > 1 or worker processes
            (``distributed_executor_backend``); a malformed window.
    """
    from minengine.models.layer_windows import hybrid_window, kv_window, layer_windows

    if config.attention_backend == "triton" and any(w is not None for w in layer_windows(hf_config)):
        raise ValueError("attention_backend='triton' takes no sliding window, and this model has windowed layers: "
                         "use attention_backend='reference'")
    window, mixed_window = kv_window(hf_config), hybrid_window(hf_config)
    if window is None and mixed_window is None:
        return KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
    _check_windowed_settings(config, window or mixed_window)
    if mixed_window is not None:
        return _hybrid_kv_cache_manager(config, num_blocks, mixed_window)
    from minengine.core.windowed_kv_cache_manager import WindowedKVCacheManager

    return WindowedKVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching, window)


def _check_windowed_settings(config: EngineConfig, window: int) -> None:
    """Refuse the settings no windowed manager supports (ValueError naming the field and what to use)."""
    for field, value, off in (("preemption_mode", config.preemption_mode, "recompute"),
                              ("async_scheduling", config.async_scheduling, False)):
        if value != off:
            raise ValueError(f"{field}={value!r} is not supported with sliding-window attention (the model's "
                             f"sliding_window is {window}): use {field}={off!r}")


def _hybrid_kv_cache_manager(config: EngineConfig, num_blocks: int, window: int) -> HybridKVCacheManager:
    """The two-group manager of a model that mixes full-attention and windowed layers, after refusing worker
    processes (only the in-process runner reads two block tables, ``worker/hybrid_model_runner.py``)."""
    from minengine.core.hybrid_kv_cache_manager import HybridKVCacheManager

    if config.tensor_parallel_size != 1:
        raise ValueError(f"tensor_parallel_size={config.tensor_parallel_size!r} is not supported with a model that "
                         "mixes full-attention and sliding-window layers (two KV cache groups): use "
                         "tensor_parallel_size=1")
    if config.distributed_executor_backend in ("mp", "external_launcher"):
        raise ValueError(f"distributed_executor_backend={config.distributed_executor_backend!r} is not supported "
                         "with a model that mixes full-attention and sliding-window layers: use None or 'uni'")
    return HybridKVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching, window)


def make_runner(config: EngineConfig, loaded: LoadedModel, pool: KVPoolSize):
    """The model in this process ("uni": a ``ModelRunner``) or in worker processes ("mp": ``minengine.executor``).

    Raises:
        WorkerFailedError: a worker process failed to start.
    """
    from minengine.executor import make_executor

    return make_executor(config, loaded.model, loaded.hf_config, loaded.model_path, loaded.device, pool.num_blocks,
                         pool.num_swap_blocks, worker_threads(config), loaded.kv_cache_dtype,
                         logits_processors=custom_logits_processors(config, loaded.hf_config))


def eos_token_id(hf_config, tokenizer) -> int | None:
    """The model's EOS id: the config's (the first of a list), else the tokenizer's; None when neither has one."""
    eos = getattr(hf_config, "eos_token_id", None)
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    return eos


def custom_logits_processors(config: EngineConfig, hf_config):
    """The engine's ``CustomLogitsProcessors`` (None without ``logits_processors``)."""
    if not config.logits_processors:
        return None
    import torch

    from minengine.config import VllmConfig
    from minengine.worker.logits_processors import CustomLogitsProcessors, load_logits_processors

    return CustomLogitsProcessors(load_logits_processors(config.logits_processors),
                                  VllmConfig(config, hf_config.vocab_size), torch.device("cpu"))


def worker_threads(config: EngineConfig) -> int:
    """torch threads of each worker process: ``num_cpu_threads``, or the cores shared out when None."""
    from minengine.distributed import available_cpu_cores

    if config.num_cpu_threads is not None:
        return config.num_cpu_threads
    return max(1, available_cpu_cores() // config.tensor_parallel_size)

"""Decode steps through ``torch.compile``: the model's own forward, compiled once, with fused CPU kernels.

Why: a decode step of a real-shaped model on a CPU is ~210 matrix-vector products and ~400 small element-wise calls
(norms, rotary, residual adds, SiLU, the attention's wrapper), each a dispatch through PyTorch's eager machinery.
``torch.compile`` (TorchDynamo traces the forward into one graph; Inductor generates C++ loops for it) fuses the
small ops into a few loops per layer and calls the matmuls directly, as vLLM's CPU backend does. The matmuls and
the paged-attention kernel stay the same calls; what goes is the dispatch and the temporaries between them.

What is compiled: ``LlamaForCausalLM.forward`` itself (``models/llama.py``, unchanged), on decode-only steps, with
the attention read as one custom op (``minengine_compiled::decode_attention``, the C++ kernel of
``layers/cpu_attention.py`` over the step's padded block table), so the graph never breaks. Steps with a prefill
chunk, or before the C++ kernel is ready, run the eager forward (``supports``). The ``ModelRunner`` holds this
door where it holds CUDA graphs (``worker/cuda_graphs.py``): ``runner.graphs``.

Shapes: one graph serves every batch size B >= 2 and block-table width W >= 2 (those sizes are marked dynamic;
the KV caches' and the weights' stay constants). Dynamo specializes sizes 0 and 1, so a step of one request is
padded to two rows (the second a copy of the first: the same token, position and K/V slot, so it writes the same
values) and a table of one block to two columns (entries past a request's ``seq_len`` are never read): no
recompilation as batches grow and shrink. (A change of torch's thread count compiles again.)

When it is on (``EngineConfig.enforce_eager``, vLLM's name): ``True`` = eager; ``False`` = compile wherever the door
applies; ``None`` (the default) = compile where it pays for its compile time, models of at least
``MIN_COMPILE_PARAMS`` parameters (``should_compile``). It applies on a CPU with the C++ attention, a float32 or
bfloat16 model with a KV cache of the same dtype, no int8 weights, world size 1 and the plain Llama class, in
the engine's own process (worker processes, ``executor/worker.py``, run eagerly).
If compiling fails (no C++ compiler, an op Inductor cannot take), the door logs once and runs eager from then on.

Inductor's cache goes under ``~/.cache/minengine/torchinductor/<machine>_<environment>`` (``inductor_cache_dir``)
unless ``TORCHINDUCTOR_CACHE_DIR`` is set: its default, ``/tmp/torchinductor_$USER``, is shared by every
virtualenv of a user on a machine.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from minengine.layers import cpu_attention
from minengine.worker.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

BACKEND = "compiled_cpu_decode"  # the attention backend name of the compiled steps' batches


def applies(model, device: torch.device, attention_backend: str, dtype: torch.dtype,
            kv_cache_dtype: torch.dtype) -> bool:
    """Whether the door can serve this model: a CPU, the C++ attention ("cpu"), a float32 / bfloat16 model whose KV
    cache has its dtype, no int8 weights, world size 1 and the plain ``LlamaForCausalLM`` (not windowed, not MoE)."""
    from minengine.models.llama import LlamaForCausalLM

    return (device.type == "cpu" and attention_backend == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and kv_cache_dtype == dtype and type(model) is LlamaForCausalLM and model.tp.world_size == 1
            and all(p.is_floating_point() for p in model.parameters()))


def should_compile(enforce_eager: bool | None, model, device: torch.device, attention_backend: str,
                   dtype: torch.dtype, kv_cache_dtype: torch.dtype) -> bool:
    """``enforce_eager`` resolved for this model: False -> compiled where the door ``applies``; True or None (the
    default) -> eager. Unlike vLLM, compiling is asked for, not the default: the first decode step pays the compile
    (minutes of CPU on a small machine), a wait that a served request would see, and its gain is not yet measured
    side by side (``benchmarks/compile_decode.py``)."""
    return enforce_eager is False and applies(model, device, attention_backend, dtype, kv_cache_dtype)


def inductor_cache_dir() -> Path:
    """Where Inductor keeps compiled kernels for this machine and environment: ``$TORCHINDUCTOR_CACHE_DIR`` when
    set, else ``$XDG_CACHE_HOME`` (``~/.cache``) ``/minengine/torchinductor/<machine_tag>_<environment_tag>``
    (the tags of ``layers/cpu_kernel_build.py``: the CPU type; torch's install, Python, the compiler)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    from minengine.layers.cpu_kernel_build import environment_tag, machine_tag

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "minengine" / "torchinductor" / f"{machine_tag()}_{environment_tag()}"


_OP = None


def decode_attention_op():
    """``minengine_compiled::decode_attention`` (defined on first use): the C++ kernel over decodes, as one op that
    Dynamo keeps whole in the graph. query [B, H, D], caches [num_blocks, block_size, Hkv, D], block_tables [B, W]
    int64, seq_lens [B] int32 -> [B, H, D] in the query's dtype."""
    global _OP
    if _OP is not None:
        return _OP

    @torch.library.custom_op("minengine_compiled::decode_attention", mutates_args=())
    def decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
        query = query.contiguous()
        out = torch.empty_like(query)
        kernel = cpu_attention.kernel_for(query, k_cache)
        kernel(out, query, k_cache, v_cache, block_tables, seq_lens, 1, scale, torch.get_num_threads(), 1.0, 1.0)
        return out

    @decode_attention.register_fake
    def _(query, k_cache, v_cache, block_tables, seq_lens, scale):
        return torch.empty_like(query, memory_format=torch.contiguous_format)

    _OP = decode_attention
    return _OP


def compiled_decode_backend(query, key, value, k_cache, v_cache, batch: ForwardBatch, scale: float,
                            k_scale: float, v_scale: float) -> torch.Tensor:
    """The attention of a compiled decode step (``layers/attention.paged_attention`` runs it for a batch whose
    ``attention_backend`` is ``BACKEND``): every row a decode, keys through ``batch.block_tables``. The K/V
    were written by ``write_kv`` in the graph; the cache has the model's dtype (scales 1)."""
    return torch.ops.minengine_compiled.decode_attention(query, k_cache, v_cache, batch.block_tables, batch.seq_lens,
                                                         scale)


def decode_block_table(batch: ForwardBatch) -> torch.Tensor:
    """The step's decode groups' blocks as one [B, W] int64 table (rows in batch order; W = the longest
    request's blocks; shorter rows padded with block 0, never read past their ``seq_len``)."""
    width = batch.decode_groups[0].num_blocks  # the longest decode comes first
    rows = [F.pad(g.block_ids.view(g.num_requests, -1), (0, width - g.num_blocks)) for g in batch.decode_groups]
    return rows[0] if len(rows) == 1 else torch.cat(rows)


def padded_decode_batch(batch: ForwardBatch) -> ForwardBatch:
    """The lean batch the compiled forward reads: at least 2 rows (a lone request's row repeated) and a table of
    at least 2 columns, ``attention_backend`` = ``BACKEND`` (see the module's docstring)."""
    table = decode_block_table(batch)
    if table.shape[1] < 2:
        table = F.pad(table, (0, 1))
    fields = dict(input_ids=batch.input_ids, positions=batch.positions, slot_mapping=batch.slot_mapping,
                  seq_lens=batch.seq_lens)
    if batch.num_tokens < 2:
        fields = {name: t.repeat(2) for name, t in fields.items()}
        table = table.repeat(2, 1)
    for t in (*fields.values(), table):  # sizes that vary step to step: symbols in the graph, never constants
        for dim in range(t.dim()):
            torch._dynamo.maybe_mark_dynamic(t, dim)
    return dataclasses.replace(batch, **fields, block_tables=table, decode_groups=[], prefill_groups=[],
                               attention_backend=BACKEND, batch_order=None, first_rows=None)


def compiled_decode(model, kv_caches, enforce_eager: bool | None, runner) -> CompiledDecode | None:
    """The door for a CPU ``ModelRunner`` (its device, attention backend and dtypes) when ``should_compile``, else
    None (every step eager)."""
    if not should_compile(enforce_eager, model, runner.device, runner.attention_backend, runner.dtype,
                          runner.kv_cache_dtype):
        return None
    return CompiledDecode(model, kv_caches)


class CompiledDecode:
    """Decode-only steps through the compiled forward; the runner runs other steps eagerly (``supports``).

    Args:
        model: the ``LlamaForCausalLM`` (``applies``); compiled lazily, at the first decode step.
        kv_caches: the runner's KV caches.

    Attributes:
        num_replays: steps run compiled; num_eager_fallbacks: steps the runner ran eagerly (the runner counts);
        failed: the compile error's text once compiling failed (then every step runs eagerly), else None.
    """

    def __init__(self, model, kv_caches):
        from minengine.layers.attention import BACKENDS

        self.model, self.kv_caches = model, kv_caches
        if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache_dir())
        decode_attention_op()  # defined before tracing: Dynamo cannot trace a definition
        BACKENDS[BACKEND] = compiled_decode_backend  # paged_attention finds the compiled steps' batches' backend
        self.forward = torch.compile(model)
        self.num_replays = self.num_eager_fallbacks = 0
        self.failed: str | None = None

    def supports(self, batch: ForwardBatch) -> bool:
        """A decode-only step (one new token per request) on the C++ kernel, compiling not failed."""
        return (self.failed is None and batch.num_decodes == batch.num_tokens and batch.attention_backend == "cpu"
                and cpu_attention.status().state == cpu_attention.KernelState.READY)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """The step's final hidden states [B, hidden] (batch order), compiled; eager once compiling failed."""
        try:
            hidden = self.forward(padded_decode_batch(batch), self.kv_caches)
        except Exception as exc:  # noqa: BLE001  (Inductor raises many types; each means: run eager)
            self.failed = f"{type(exc).__name__}: {exc}"
            logger.warning("minengine: torch.compile failed, decode steps run eagerly from now on (%s)",
                           self.failed.splitlines()[0][:500])
            return self.model(batch, self.kv_caches)
        self.num_replays += 1
        return hidden[:batch.num_tokens]

"""Lab 6, paged attention's read: the spec (checks) and the install (the engine's attention layers call the
learner's ``paged_attention``).

The learner writes ``gather_kv`` (a request's keys through its block table), ``attend`` (causal grouped-query
attention of a chunk against its keys) and ``paged_attention`` (the step: every request's rows). The checks
compare them with an independent dense attention in float64 (``dense_attention``), on hand-made cases whose
names say which rule they test, then on random steps (hypothesis); the end-to-end check runs the real engine
with every attention layer reading through the learner's function.
"""

from __future__ import annotations

from types import ModuleType

import torch

from minengine.exceptions import VLLMValidationError
from minengine.labs.door import mix_into
from minengine.labs.end_to_end import end_to_end_check
from minengine.labs.grading import Check, LabFailure, learner_files, where_raised
from minengine.labs.registry import SKELETONS, LabSpec
from minengine.models.llama import Attention
from minengine.worker.model_runner import ModelRunner

LAB = "paged_attention"
TOLERANCE = 1e-4  # float32 attention against a float64 reference: agreement to ~1e-6; a bug is off by >> 1e-3


# ---- an independent reference ------------------------------------------------------------------------------
def dense_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal GQA of ``query`` [q_len, Hq, D] (the last q_len positions) against ``keys`` / ``values``
    [seq_len, Hkv, D], in float64, one (row, head) at a time: the definition, not a fast path."""
    q_len, num_heads, _ = query.shape
    seq_len, num_kv_heads, _ = keys.shape
    out = torch.zeros(q_len, num_heads, query.shape[2], dtype=torch.float64)
    for i in range(q_len):
        visible = seq_len - q_len + i + 1  # keys at positions 0 .. its own
        for h in range(num_heads):
            kv = h // (num_heads // num_kv_heads)
            weights = (keys[:visible, kv].double() @ query[i, h].double() * scale).softmax(0)
            out[i, h] = weights @ values[:visible, kv].double()
    return out


def _distinct_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """A cache whose every element says where it is: ``block * 1000 + slot * 10 + head`` (+ dim / 100)."""
    b = torch.arange(num_blocks).view(-1, 1, 1, 1) * 1000.0
    s = torch.arange(block_size).view(1, -1, 1, 1) * 10.0
    h = torch.arange(num_kv_heads).view(1, 1, -1, 1) * 1.0
    d = torch.arange(head_dim).view(1, 1, 1, -1) / 100.0
    return (b + s + h + d).float()


def _where(value: float, block_size: int) -> str:
    block, rest = divmod(int(round(value * 100)) // 100, 1000)
    return f"block {block} slot {rest // 10}"


# ---- unit checks ---------------------------------------------------------------------------------------------
PAD = 8  # the block tables' padding in the gather cases: one past the last block of their 8-block caches
GATHER_CASES = [  # (what it tests, block_size, block table, seq_len)
    ("a partly filled last block", 4, [5, 2, 7, PAD], 10),
    ("exactly full blocks, then padding", 4, [3, 6, PAD, PAD], 8),
    ("one token", 4, [6, PAD, PAD, PAD], 1),
    ("block ids out of order", 2, [7, 1, 4, 0, 5], 9),
]


def read_padding_words(error: IndexError, module: ModuleType) -> str:
    """What an IndexError out of the learner's read most likely means: it read a padding entry of a block table
    (the checks pad with an id past the cache's last block, as a GPU kernel would fault on one)."""
    return (f"it read a padding entry of a block table: the entries past a request's ceil(seq_len / block_size) "
            f"blocks are padding, not blocks (here an id past the cache's last block, as a GPU kernel would fault "
            f"on): read only the blocks the request holds (raised IndexError: {error}, at "
            f"{where_raised(error, learner_files(module))})")


def check_gather_kv(module: ModuleType) -> None:
    for what, block_size, table, seq_len in GATHER_CASES:
        cache = _distinct_cache(8, block_size, 2, 3)
        label = f"gather_kv ({what}: block_size {block_size}, block table {table}, seq_len {seq_len})"
        got = call_case(label, module, module.gather_kv, cache=cache,
                        block_table=torch.tensor(table, dtype=torch.int32), seq_len=seq_len)
        if not isinstance(got, torch.Tensor):
            raise LabFailure(f"{label}: returned {type(got).__name__}, expected a tensor of shape ({seq_len}, 2, 3)")
        if tuple(got.shape) != (seq_len, 2, 3):
            raise LabFailure(f"{label}: returned shape {tuple(got.shape)}, expected ({seq_len}, 2, 3): one row per "
                             f"position 0..{seq_len - 1}, no more (the last block's unused slots are not keys)")
        for p in range(seq_len):
            expected = cache[table[p // block_size], p % block_size]
            if not torch.equal(got[p], expected):
                raise LabFailure(f"{label}: position {p} must come from block {table[p // block_size]} slot "
                                 f"{p % block_size} (block_table[p // block_size], p % block_size), got the "
                                 f"values of {_where(float(got[p, 0, 0]), block_size)}")


ATTEND_CASES = [  # (what it tests, q_len, seq_len, Hq, Hkv, scale: None for 1/sqrt(D))
    ("a decode: one query at the last position sees every key; scores scaled by 1/sqrt(D)", 1, 5, 2, 2, None),
    ("a prefill from position 0: the causal mask (no token sees a later one)", 6, 6, 2, 2, None),
    ("a chunk after cached context: it sees the whole context and its own causal triangle", 3, 8, 2, 2, None),
    ("grouped-query attention: query head h reads KV head h // (Hq // Hkv)", 2, 6, 8, 2, None),
    ("the scale given, 0.6, not 1/sqrt(D) = 0.25 (models may set their own)", 3, 7, 2, 2, 0.6),
]


def check_attend(module: ModuleType) -> None:
    gen = torch.Generator().manual_seed(6)
    for what, q_len, seq_len, num_heads, num_kv_heads, scale in ATTEND_CASES:
        head_dim = 16
        query = torch.randn(q_len, num_heads, head_dim, generator=gen) * 2
        keys = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen) * 2
        values = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
        scale = head_dim ** -0.5 if scale is None else scale
        label = f"attend, {what} (q_len {q_len}, seq_len {seq_len}, Hq {num_heads}, Hkv {num_kv_heads})"
        got = call_case(label, module, module.attend, query=query, keys=keys, values=values, scale=scale)
        _compare(label, got, dense_attention(query, keys, values, scale), seq_len - q_len)
    check_large_scores(module)
    check_bfloat16(module)


def check_large_scores(module: ModuleType) -> None:
    """Logits in the hundreds (a sharp attention head): exp() of a logit above ~88.7 is inf in float32."""
    gen = torch.Generator().manual_seed(7)
    query, keys = torch.randn(3, 2, 16, generator=gen) * 12, torch.randn(7, 2, 16, generator=gen) * 12
    values = torch.randn(7, 2, 16, generator=gen)
    largest = float((torch.einsum("qhd,khd->hqk", query, keys) * 0.25).max())
    label = f"attend with large scores (scale * q.k up to {largest:.0f}; q_len 3, seq_len 7, Hq 2, Hkv 2)"
    got = call_case(label, module, module.attend, query=query, keys=keys, values=values, scale=0.25)
    if isinstance(got, torch.Tensor) and not bool(torch.isfinite(got).all()):
        raise LabFailure(f"{label}: the output holds NaN or inf: exp(score) overflowed float32 (its largest value is "
                         f"about e^88.7, and inf / inf is NaN). Subtract each row's largest score before exp: "
                         f"exp(s - max) <= 1 cannot overflow and gives the same weights, exp(s - max) / sum exp(s - "
                         f"max) = exp(s) / sum exp(s) (torch.softmax does it for you)")
    _compare(label, got, dense_attention(query, keys, values, 0.25), 4)


BF16_TOLERANCE = 0.1  # bfloat16 keeps 8 bits of mantissa: logits of ~10 are rounded by ~0.04, weights by ~4%


def check_bfloat16(module: ModuleType) -> None:
    """A bfloat16 model's attention: the output is in query's dtype (the next layer, o_proj, is bfloat16)."""
    gen = torch.Generator().manual_seed(8)
    query = (torch.randn(2, 4, 16, generator=gen) * 2).bfloat16()
    keys = (torch.randn(6, 2, 16, generator=gen) * 2).bfloat16()
    values = torch.randn(6, 2, 16, generator=gen).bfloat16()
    label = "attend in bfloat16 (q_len 2, seq_len 6, Hq 4, Hkv 2)"
    got = call_case(label, module, module.attend, query=query, keys=keys, values=values, scale=0.25)
    if isinstance(got, torch.Tensor) and got.dtype != query.dtype:
        raise LabFailure(f"{label}: returned {got.dtype}, expected torch.bfloat16 (query's dtype): the model's next "
                         f"layer (o_proj) is bfloat16 and refuses another dtype. Computing in float32 is fine; cast "
                         f"the result back with .to(query.dtype)")
    _compare(label, got, dense_attention(query, keys, values, 0.25), 4, BF16_TOLERANCE)


def call_case(label: str, module: ModuleType, function, **inputs):
    """``function(*inputs)``; an IndexError (a padding block read) or a RuntimeError out of the learner's code
    (most often a shape that does not broadcast) becomes a ``LabFailure`` naming the case and its inputs' shapes."""
    try:
        return function(*inputs.values())
    except IndexError as error:
        raise LabFailure(f"{label}: {read_padding_words(error, module)}") from None
    except NotImplementedError:
        raise
    except RuntimeError as error:
        shapes = ", ".join(f"{name} {_describe(value)}" for name, value in inputs.items())
        raise LabFailure(f"{label}: raised RuntimeError: {error}\n  at {where_raised(error, learner_files(module))}"
                         f"\n  the inputs of this case: {shapes}") from None


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"[{', '.join(map(str, value.shape))}] {str(value.dtype).removeprefix('torch.')}"
    return repr(value)


def _check_shape(label: str, got, shape: tuple) -> None:
    if not isinstance(got, torch.Tensor):
        raise LabFailure(f"{label}: returned {type(got).__name__}, expected a tensor of shape {shape}")
    if tuple(got.shape) != shape:
        raise LabFailure(f"{label}: returned shape {tuple(got.shape)}, expected {shape}")


def _compare(label: str, got: torch.Tensor, expected: torch.Tensor, first_position: int,
             tolerance: float = TOLERANCE) -> None:
    _check_shape(label, got, tuple(expected.shape))
    error = (got.double() - expected).abs()
    if not error.max() <= tolerance:  # NaN fails too
        row, head = divmod(int(torch.nan_to_num(error, nan=1e9).amax(-1).argmax()), got.shape[1])
        raise LabFailure(f"{label}: query row {row} (position {first_position + row}) head {head} is off by "
                         f"{float(error[row, head].max()):.3g} from the definition softmax(scale * q.k, causal) v "
                         f"(tolerance {tolerance:g})")


def _random_step(seed: int, num_requests: int, block_size: int, num_kv_heads: int, group: int):
    """A step of ``num_requests`` requests (random context and new tokens) over a shuffled block pool:
    (query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, per-request (rows, keys, values))."""
    gen = torch.Generator().manual_seed(seed)
    head_dim = 8
    lens = [(int(torch.randint(0, 20, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen)))
            for _ in range(num_requests)]  # (context, new tokens)
    needed = [-(-(c + q) // block_size) for c, q in lens]
    pool = torch.randperm(sum(needed) + 3, generator=gen)
    k_cache = torch.randn(len(pool), block_size, num_kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(len(pool), block_size, num_kv_heads, head_dim, generator=gen)
    width = max(needed) + 1
    tables = torch.full((num_requests, width), len(pool), dtype=torch.int32)  # padding: past the last block
    first = 0
    for b, n in enumerate(needed):
        tables[b, :n] = pool[first:first + n]
        first += n
    q_lens = [q for _, q in lens]
    query = torch.randn(sum(q_lens), num_kv_heads * group, head_dim, generator=gen)
    seq_lens = torch.tensor([c + q for c, q in lens], dtype=torch.int32)
    query_start_loc = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return query, k_cache, v_cache, tables, seq_lens, query_start_loc


STEP_INPUTS = ("query", "k_cache", "v_cache", "block_tables", "seq_lens", "query_start_loc")


def _step_reference(query, k_cache, v_cache, tables, seq_lens, query_start_loc, scale) -> torch.Tensor:
    out = torch.zeros(query.shape, dtype=torch.float64)
    block_size = k_cache.shape[1]
    for b, seq_len in enumerate(seq_lens.tolist()):
        rows = slice(int(query_start_loc[b]), int(query_start_loc[b + 1]))
        positions = torch.arange(seq_len)
        blocks = tables[b].long()[positions // block_size]
        keys, values = k_cache[blocks, positions % block_size], v_cache[blocks, positions % block_size]
        out[rows] = dense_attention(query[rows], keys, values, scale)
    return out


def check_paged_attention(module: ModuleType) -> None:
    step = _random_step(60, 3, 4, 2, 2)
    got = call_case(f"paged_attention on a step of 3 requests (block tables {step[3].tolist()}, seq_lens "
                    f"{step[4].tolist()})", module, module.paged_attention, **dict(zip(STEP_INPUTS, step)),
                    scale=8 ** -0.5)
    seq_lens, qsl = step[4].tolist(), step[5].tolist()
    expected = _step_reference(*step, 8 ** -0.5)
    _check_shape("paged_attention on a step of 3 requests", got, tuple(expected.shape))
    for b in range(len(seq_lens)):
        rows = slice(qsl[b], qsl[b + 1])
        label = (f"paged_attention, request {b} of a step of {len(seq_lens)} (rows {qsl[b]} to {qsl[b + 1] - 1} "
                 f"inclusive, query[{qsl[b]}:{qsl[b + 1]}], seq_len {seq_lens[b]}, block table "
                 f"{step[3][b].tolist()})")
        _compare(label, got[rows], expected[rows], seq_lens[b] - (qsl[b + 1] - qsl[b]))
    half = (step[0].bfloat16(), step[1].bfloat16(), step[2].bfloat16(), *step[3:])
    got = call_case("paged_attention on the same step in bfloat16", module, module.paged_attention,
                    **dict(zip(STEP_INPUTS, half)), scale=8 ** -0.5)
    if getattr(got, "dtype", None) != torch.bfloat16:
        raise LabFailure(f"paged_attention on the same step in bfloat16 returned {getattr(got, 'dtype', got)}, "
                         f"expected torch.bfloat16 (query's dtype: the model's next layer, o_proj, refuses another)")


# ---- property check --------------------------------------------------------------------------------------------
def check_random_steps(module: ModuleType) -> None:
    """Any step: 1-4 requests, any block size, MHA or GQA, any context and chunk, shuffled blocks."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=25, derandomize=True, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 10**6), num_requests=st.integers(1, 4), block_size=st.sampled_from([1, 2, 4, 16]),
           num_kv_heads=st.integers(1, 2), group=st.sampled_from([1, 2, 4]), sharpness=st.sampled_from([1, 40]))
    def random_step(seed, num_requests, block_size, num_kv_heads, group, sharpness):
        step = _random_step(seed, num_requests, block_size, num_kv_heads, group)
        step = (step[0] * sharpness, *step[1:])  # 40: scores in the tens to hundreds, a sharp head
        label = (f"paged_attention on a random step (seed {seed}: {num_requests} requests, block_size {block_size}, "
                 f"Hkv {num_kv_heads}, Hq {num_kv_heads * group}, seq_lens {step[4].tolist()}, new tokens "
                 f"{step[5].diff().tolist()}, query scaled by {sharpness})")
        got = call_case(label, module, module.paged_attention, **dict(zip(STEP_INPUTS, step)), scale=0.3)
        expected = _step_reference(*step, 0.3)
        if tuple(got.shape) != tuple(expected.shape) or not (got.double() - expected).abs().max() <= TOLERANCE:
            nan = isinstance(got, torch.Tensor) and not bool(torch.isfinite(got).all())
            raise LabFailure(f"{label} differs from the definition" + (" (its output holds NaN or inf)" if nan else ""))

    random_step()


# ---- the engine on the learner's read ------------------------------------------------------------------------
class LabAttention(Attention):
    """An attention layer that reads the paged cache through the learner's ``paged_attention`` (a subclass
    per install holds the learner's module as ``lab_module``). K/V are written as the engine writes them."""

    lab_module: ModuleType

    def forward(self, x: torch.Tensor, rope, batch, kv_cache) -> torch.Tensor:
        from minengine.layers.attention import write_kv
        from minengine.layers.rotary import apply_rotary

        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k_cache, v_cache = kv_cache
        write_kv(k, v, k_cache, v_cache, batch.slot_mapping)
        o = self.lab_module.paged_attention(q, k_cache, v_cache, batch.lab_block_tables, batch.seq_lens,
                                            batch.query_start_loc, self.scale)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class BlockTables:
    """``ModelRunner`` mixin: its batches also carry ``lab_block_tables`` [B, max_blocks] int32 (batch order, each
    row padded past its request's blocks with an id past the pool's last block), the input of the learner's read
    (the CPU backends' batches carry groups instead)."""

    def prepare_inputs(self, scheduler_output):
        batch = super().prepare_inputs(scheduler_output)
        tables = [scheduler_output.scheduled[i].block_ids for i in batch.batch_order.tolist()]
        width = max(map(len, tables))
        pad = self.kv_caches[0][0].shape[0]  # an id past the last block: a read of padding fails, never misleads
        batch.lab_block_tables = torch.tensor([t + [pad] * (width - len(t)) for t in tables], dtype=torch.int32)
        return batch


def install(engine, module: ModuleType) -> None:
    """Every attention layer of ``engine``'s model reads through ``module.paged_attention``.

    Raises:
        VLLMValidationError: naming ``labs``: the model is not in this process (worker processes), or its KV
            cache is not in the model's dtype (the lab reads plain float caches, no FP8 scales).
    """
    runner = engine.runner
    if not isinstance(runner, ModelRunner):
        raise VLLMValidationError("the paged_attention lab runs the model in this process "
                                  "(tensor_parallel_size=1)", parameter="labs")
    if runner.kv_cache_dtype != runner.dtype:
        raise VLLMValidationError("the paged_attention lab reads a KV cache in the model's dtype "
                                  "(kv_cache_dtype='auto')", parameter="labs")
    mix_into(runner, BlockTables)  # the runner also hands the block tables down
    layer_class = type("LabAttention", (LabAttention,), {"lab_module": module})
    for layer in runner.model.model.layers:
        layer.self_attn.__class__ = layer_class


SPEC = LabSpec(
    name=LAB, title="Paged attention's read", order=6, minutes=60,
    teaches="how attention reads a KV cache split into blocks: gather by block table, the causal mask of a chunk "
            "after cached context, grouped-query heads, the softmax scale",
    part="the attention read (paged_attention, minengine/layers/attention.py and reference_attention.py)",
    skeleton=SKELETONS / LAB / f"{LAB}.py", solution=f"minengine.labs.solutions.{LAB}",
    checks=[
        Check("gather_kv: positions in order through the block table, the last block cut at seq_len", "unit",
              check_gather_kv),
        Check("attend: scale, causal mask (prefill, chunk after context), grouped-query heads, large scores, "
              "bfloat16", "unit",
              check_attend),
        Check("paged_attention: every request's rows of a step", "unit", check_paged_attention),
        Check("random steps: any block size, heads, context and chunk, shuffled blocks", "property",
              check_random_steps),
        Check("the engine on your attention matches transformers: chunked prefill, prefix hits", "end_to_end",
              end_to_end_check(LAB, ["chunked_prefill", "prefix_hits"])),
    ],
    install=install,
)

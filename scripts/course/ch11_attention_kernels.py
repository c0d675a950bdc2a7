# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 11: attention kernels: dense -> paged gather -> tiled online softmax (FlashAttention) -> split-K decode
(FlashDecoding); HBM bytes counted and put on the H100 roofline; the engine's C++ CPU kernel and Triton kernel as the
real things, checked equal to dense attention."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(11, "Attention kernels: from dense to FlashAttention and FlashDecoding", [
        "Count the HBM bytes dense attention moves (the score matrix written and read back) and see why a long prompt makes it memory-bound.",
        "Read keys through a block table two ways: gather them into a copy first, or read each block in place.",
        "Write tiled attention with an online softmax (a running max and a running sum) and see why it is exact, not an approximation.",
        "Split a long decode's keys over several programs (FlashDecoding) and merge their partial results exactly.",
        "Put each algorithm's FLOPs and bytes on the H100 roofline, and run the engine's C++ CPU kernel and its Triton kernel, checked equal to dense attention.",
    ], ["Dao et al., *FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness*, NeurIPS 2022 (Algorithms 0 and 1, Theorem 2)",
        "Milakov & Gimelshein, *Online normalizer calculation for softmax*, 2018",
        "Dao, *FlashAttention-2*, 2023; Dao, Haziza, Massa & Sizov, *Flash-Decoding for long-context inference*, 2023",
        "Kwon et al., *PagedAttention*, SOSP 2023, section 4.1",
        "NVIDIA H100 Tensor Core GPU datasheet and architecture whitepaper (989 TFLOP/s BF16 dense, 3.35 TB/s, 132 SMs)"]),
    md("""
    **Before anything imports Triton**: the engine's Triton kernel runs on this CPU through Triton's *interpreter*, and
    Triton decides between compiling and interpreting once, when it is first imported. So the first cell sets
    `TRITON_INTERPRET=1` before the setup imports anything (minengine imports Triton at the first kernel call, not before). On a
    machine with a CUDA GPU, leave the variable out to run the compiled kernel.
    """),
    code("""
    import os

    os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported anywhere in this kernel
    """),
    code(SETUP + """\
import math

import torch

from minengine.course import teaching_cost_model
from minengine.timing import StepWork, get_hardware
from minengine.timing.model_shape import LLAMA_3_8B
from minengine.viz.cost_figures import roofs_figure

F64 = torch.float64   # the toys compute in float64, so "exact" means equal to about 1e-15
"""),
    md("""
    ## Attention, and where its bytes go
    For one head, attention is `O = softmax(Q Kᵀ / √d) V`: `n` new queries against `c` keys (the request's cached tokens,
    this step's included), each a vector of `d` numbers. On a GPU the operands live in **HBM** (80 GB, 3.35 TB/s on an
    H100) and the arithmetic happens next to small on-chip **SRAM** (about 228 KB per SM) (source: NVIDIA H100 datasheet and Hopper tuning guide). A kernel's speed is set by
    the FLOPs it does *and* the bytes it moves between the two (chapter 1's roofline). The toy below is a memory that
    counts: every tensor a kernel `load`s from it or `store`s to it is counted in bytes, 2 per element (bf16), whatever
    the toy computes in.

    ## Toy 1: dense attention (the textbook kernel)
    Dao et al.'s Algorithm 0, the way a framework runs it op by op: write the scores `S = Q Kᵀ` to HBM, read them back
    for the softmax, write the probabilities `P`, read them back to multiply by `V`.
    """),
    code("""
    class HBM:
        \"\"\"A toy GPU memory: counts the bytes loaded from it and stored to it (bytes_per_element each).\"\"\"

        def __init__(self, bytes_per_element=2):
            self.bytes_per_element, self.read, self.written = bytes_per_element, 0, 0

        def load(self, t):
            self.read += t.numel() * self.bytes_per_element
            return t

        def store(self, t):
            self.written += t.numel() * self.bytes_per_element
            return t

        @property
        def total(self):
            return self.read + self.written


    def causal_mask(n, c):
        \"\"\"True where query i (at position c - n + i) must not see key j (j > its position).\"\"\"
        return torch.arange(c)[None, :] > torch.arange(c - n, c)[:, None]


    def dense_attention(q, k, v, hbm):
        \"\"\"q [n, d], k and v [c, d]: the last n of c positions attend causally. S and P go through HBM.\"\"\"
        n, c, d = q.shape[0], k.shape[0], q.shape[1]
        s = hbm.store(hbm.load(q) @ hbm.load(k).T * d ** -0.5)                                   # S = Q K^T
        p = hbm.store(torch.softmax(hbm.load(s).masked_fill(causal_mask(n, c), float("-inf")), dim=-1))
        return hbm.store(hbm.load(p) @ hbm.load(v))                                               # O = P V


    torch.manual_seed(0)
    n, c, d, BS = 40, 100, 16, 16          # 40 new queries, 100 keys, head_dim 16, 16-token KV blocks
    q = torch.randn(n, d, dtype=F64)
    k, v = torch.randn(c, d, dtype=F64), torch.randn(c, d, dtype=F64)
    dense_hbm = HBM()
    dense_out = dense_attention(q, k, v, dense_hbm)
    print(f"dense: {dense_hbm.read:,} bytes read, {dense_hbm.written:,} written; the n x c score matrix alone is {n * c * 2:,} bytes")
    """),
    md("""
    ## Toy 2: keys through a block table
    In a paged cache (chapter 2) the keys sit in blocks scattered over a pool. The simplest kernel **gathers** them into a
    contiguous copy first, then runs the dense kernel: the engine's torch path does this (`layers/attention.py`,
    `_gather`), and it costs one more read and one more write of K and V (checked: the gather only adds bytes). A paged kernel reads each block **in place**
    through the table instead (vLLM's kernels, the engine's C++ and Triton kernels).
    """),
    code("""
    POOL = 32
    table = torch.randperm(POOL)[: math.ceil(c / BS)]                   # scattered physical blocks
    k_cache, v_cache = torch.zeros(POOL, BS, d, dtype=F64), torch.zeros(POOL, BS, d, dtype=F64)
    for pos in range(c):
        k_cache[table[pos // BS], pos % BS], v_cache[table[pos // BS], pos % BS] = k[pos], v[pos]


    def gather(cache, table, c, hbm):
        \"\"\"Copy the first c slots of a request's blocks into one contiguous [c, d] tensor (read blocks, write copy).\"\"\"
        blocks = hbm.load(cache[table[: math.ceil(c / BS)]])
        return hbm.store(blocks.reshape(-1, cache.shape[-1])[:c])


    gather_hbm = HBM()
    gathered_out = dense_attention(q, gather(k_cache, table, c, gather_hbm), gather(v_cache, table, c, gather_hbm), gather_hbm)
    print(f"gather + dense: {gather_hbm.total:,} bytes ({gather_hbm.total - dense_hbm.total:,} more than dense), "
          f"same output: {torch.allclose(gathered_out, dense_out)}")
    """),
    md("""
    ## Toy 3: tiled attention with an online softmax (FlashAttention)
    FlashAttention never writes `S` or `P`. It takes a **tile** of queries into SRAM and streams the key blocks past it,
    keeping three running numbers per query row: the **max** `m` of the scores seen so far, the **sum** `l` of
    `exp(score - m)`, and the weighted sum `acc` of the values. When a block brings a larger max `m_new`, everything
    accumulated so far was scaled by `exp(-m)` instead of `exp(-m_new)`, so it is multiplied by `exp(m - m_new)`; the
    result is the same softmax, only computed in pieces (Milakov & Gimelshein 2018; Dao et al. 2022, Algorithm 1):

        m_new = max(m, max_j s_j)
        l     = l * exp(m - m_new) + sum_j exp(s_j - m_new)
        acc   = acc * exp(m - m_new) + sum_j exp(s_j - m_new) v_j
        out   = acc / l                          (after the last block)

    It reads the blocks through the block table in place: no gather.
    """),
    code("""
    def flash_attention(q, k_cache, v_cache, table, c, hbm, q_tile=16, trace=None):
        \"\"\"Tiled causal attention with an online softmax; K/V blocks read in place through the block table.\"\"\"
        n, d = q.shape
        out = []
        for t0 in range(0, n, q_tile):
            qt = hbm.load(q[t0:t0 + q_tile]) * d ** -0.5
            pos = c - n + t0 + torch.arange(qt.shape[0])                       # the tile's query positions
            m = torch.full((qt.shape[0],), float("-inf"), dtype=F64)
            l, acc = torch.zeros(qt.shape[0], dtype=F64), torch.zeros(qt.shape[0], d, dtype=F64)
            for j in range(math.ceil((int(pos[-1]) + 1) / BS)):                # only blocks with a key the tile may see
                valid = min(BS, c - j * BS)
                kb, vb = hbm.load(k_cache[table[j], :valid]), hbm.load(v_cache[table[j], :valid])
                s = (qt @ kb.T).masked_fill(j * BS + torch.arange(valid)[None, :] > pos[:, None], float("-inf"))
                m_new = torch.maximum(m, s.max(dim=1).values)
                rescale = torch.exp(m - m_new)                                  # old state to the new max
                p = torch.exp(s - m_new[:, None])
                l = l * rescale + p.sum(dim=1)
                acc = acc * rescale[:, None] + p @ vb
                m = m_new
                if trace is not None:
                    trace.append((j, m[-1].item(), l[-1].item(), rescale[-1].item()))
            out.append(hbm.store(acc / l[:, None]))
        return torch.cat(out)


    flash_hbm = HBM()
    flash_out = flash_attention(q, k_cache, v_cache, table, c, flash_hbm)
    flash_error = (flash_out - dense_out).abs().max().item()
    print(f"flash: {flash_hbm.total:,} bytes ({flash_hbm.total / dense_hbm.total:.0%} of dense); max |flash - dense| = {flash_error:.1e}")
    """),
    md("""
    Watch the running state of one query row: a long decode row (`c = 256` keys, scores spread wide), one point per key
    block. The max only ever rises; each time it rises, the sum accumulated so far is scaled down by `exp(m - m_new)`.
    """),
    code("""
    c_long = 256
    table_long = torch.randperm(POOL)[: c_long // BS]
    k_long = torch.randn(c_long, d, dtype=F64) * torch.linspace(0.5, 2.0, c_long, dtype=F64)[:, None]   # later keys score higher
    v_long = torch.randn(c_long, d, dtype=F64)
    kc_long, vc_long = torch.zeros(POOL, BS, d, dtype=F64), torch.zeros(POOL, BS, d, dtype=F64)
    kc_long[table_long] = k_long.view(-1, BS, d)
    vc_long[table_long] = v_long.view(-1, BS, d)
    q_row = 3 * torch.randn(1, d, dtype=F64)
    state = []
    row_out = flash_attention(q_row, kc_long, vc_long, table_long, c_long, HBM(), trace=state)
    row_dense = dense_attention(q_row, k_long, v_long, HBM())
    blocks, maxima, sums, rescales = zip(*state)
    fig = go.Figure([go.Scatter(x=blocks, y=maxima, name="running max m", mode="lines+markers", line_shape="hv"),
                     go.Scatter(x=blocks, y=sums, name="running sum l (of exp(s - m))", mode="lines+markers", yaxis="y2")])
    for b, r in zip(blocks, rescales):
        if r < 1:
            fig.add_annotation(x=b, y=maxima[b], text=f"x{r:.2f}", showarrow=False, yshift=12)
    titled(fig, "FlashAttention's running max and sum for one decode row, block by block",
           clock_label="no clock: float64 arithmetic (labels: the factor exp(m - m_new) applied to the old sum)")
    fig.update_layout(xaxis_title="key block visited", yaxis_title="running max m",
                      yaxis2=dict(title="running sum l", overlaying="y", side="right", tickmode="auto", showgrid=False),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0))
    fig.show()
    """),
    conclusion("""
    rises = sum(r < 1 for r in rescales)
    row_error = (row_out - row_dense).abs().max().item()
    conclude(f"The tiled kernel moved **{flash_hbm.total:,} bytes** where dense attention moved {dense_hbm.total:,} "
             f"({flash_hbm.total / dense_hbm.total:.0%}) and the gather-then-dense kernel {gather_hbm.total:,}, and its output equals dense "
             f"attention to **{flash_error:.0e}** (float64 rounding). On the long row the max rose at {rises} of {len(blocks)} blocks, each time "
             f"rescaling the old sum, and the result still equals dense attention to {row_error:.0e}: the online softmax is the same "
             f"softmax computed in pieces, not an approximation.",
             [("flash equals dense to float64 rounding", flash_error < 1e-12 and row_error < 1e-12),
              ("flash moves fewer bytes than dense, and the gather adds bytes", flash_hbm.total < dense_hbm.total < gather_hbm.total),
              ("the running max rose more than once and never fell", rises >= 2 and all(a <= b for a, b in zip(maxima, maxima[1:]))),
              ("the running sum was rescaled when the max rose", any(r < 1 for r in rescales[1:]))])
    """),
    md("""
    ## Toy 4: split-K decode (FlashDecoding)
    A decode has **one** query row per head. FlashAttention parallelises over query tiles, heads and requests, so a
    batch-1 decode on Llama-3-8B runs one program per KV head (its 4 query heads packed together: 8 programs; 32 without
    packing) on a GPU with 132 SMs: most of the chip waits while a few SMs stream a 32k-token K/V. FlashDecoding **splits the keys** into chunks, each
    program producing a partial `(m, l, acc)` for its chunk, and a small second kernel merges the partials, with the
    same rescaling as the online softmax. The bytes barely change; what changes is how many SMs pull them.
    """),
    code("""
    def split_k_partials(q_row, k_cache, v_cache, table, c, splits, hbm):
        \"\"\"One decode row: the key blocks cut into `splits` chunks; per chunk its partial (m, l, acc), stored to HBM.\"\"\"
        d, num_blocks = q_row.shape[-1], math.ceil(c / BS)
        per_split, parts = math.ceil(num_blocks / splits), []
        for first in range(0, num_blocks, per_split):
            qv, m, l, acc = hbm.load(q_row[0]) * d ** -0.5, float("-inf"), 0.0, torch.zeros(d, dtype=F64)
            for j in range(first, min(first + per_split, num_blocks)):
                valid = min(BS, c - j * BS)
                s = hbm.load(k_cache[table[j], :valid]) @ qv
                m_new = max(m, s.max().item())
                p = torch.exp(s - m_new)
                l = l * math.exp(m - m_new) + p.sum().item()
                acc = acc * math.exp(m - m_new) + p @ hbm.load(v_cache[table[j], :valid])
                m = m_new
            hbm.store(torch.zeros(d + 2))          # the partial (m, l, acc) goes to HBM for the merge kernel
            parts.append((m, l, acc))
        return parts


    split_hbm = HBM()
    parts = split_k_partials(q_row, kc_long, vc_long, table_long, c_long, splits=4, hbm=split_hbm)
    for i, (m_s, l_s, _) in enumerate(parts):
        print(f"split {i}: keys {i * c_long // 4:3d}..{(i + 1) * c_long // 4 - 1:3d}  m = {m_s:6.3f}  l = {l_s:8.3f}")
    """),
    md("""
    How do the partials combine into the exact output? That is Exercise 2 below; the merge is the online softmax's
    rescaling applied once per split.

    ## The bytes of each kernel, at Llama-3-8B sizes, on the H100 roofline
    The counts above, as formulas at full size: one layer of Llama-3-8B (32 query heads, 8 KV heads, `d = 128`, bf16),
    a prefill of `n` tokens from position 0. The formulas (`minengine/course/attention_traffic.py`: `dense_bytes`, `gather_bytes`,
    `flash_bytes`, `attention_flops`) are the toys' own counts (checked on the toy shapes below).
    Two tiled kernels: the textbook tile of 128 queries whose K/V tile serves the 4 query heads of its KV head
    (FlashAttention-2/-3 style, GQA packed), and a tile of **one** query of one head, which is what the engine's
    Triton kernel runs (one program per query token and head, `layers/triton_attention.py`). Bytes are counted at HBM
    as if no cache in between kept anything: the H100's 50 MB L2 absorbs part of the re-reads, most for the one-query
    kernel (source: NVIDIA H100 architecture whitepaper, for the L2 size). Time is the roofline bound `max(FLOPs / 989 TFLOP/s, bytes / 3.35 TB/s)`: the datasheet peaks, the best
    any kernel could do.
    """),
    code("""
    # The formulas live in the course package, so chapter 8 quotes the same bytes: read them there.
    from minengine.course.attention_traffic import attention_flops, dense_bytes, flash_bytes, gather_bytes

    H100 = get_hardware("h100")
    SHAPE = LLAMA_3_8B
    HQ, HKV, D = SHAPE.num_heads, SHAPE.num_kv_heads, SHAPE.head_dim
    G = HQ // HKV
    ROOFLINE = (f"roofline bound: {H100.name} datasheet peaks ({H100.peak_flops_16bit / 1e12:.0f} TFLOP/s, "
                f"{H100.memory_bandwidth / 1e12:.2f} TB/s), {SHAPE.name} attention shapes, bf16")


    toy_checks = {"dense": (dense_bytes(n, c, d), dense_hbm.total), "gather + dense": (gather_bytes(c, d) + dense_bytes(n, c, d), gather_hbm.total),
                  "flash (16-query tiles)": (flash_bytes(n, c, d, 16), flash_hbm.total)}
    for name, (formula, counted) in toy_checks.items():
        print(f"{name:24s} formula {formula:7,} bytes, toy counted {counted:7,}")


    def kernels(n):
        \"\"\"Per layer of SHAPE, a prefill of n tokens from 0: {kernel: bytes}.\"\"\"
        return {"dense (S, P in HBM)": HQ * dense_bytes(n, n, D),
                "gather + dense": HQ * dense_bytes(n, n, D) + HKV * gather_bytes(n, D),
                "1 query per program (the engine's Triton kernel)": HQ * flash_bytes(n, n, D, q_tile=1),
                "FlashAttention, 128-query tiles, GQA packed": HKV * flash_bytes(n, n, D, q_tile=128, group=G)}


    def roofline_s(flops, nbytes):
        return max(flops / H100.peak_flops_16bit, nbytes / H100.memory_bandwidth)


    lengths = pick([512, 1024, 2048, 4096, 8192, 16384, 32768], [512, 2048, 8192, 32768])
    table_bytes = {n_: kernels(n_) for n_ in lengths}
    # dense and gather + dense nearly coincide on a log axis: dense drawn first, wide and faint; the gather on top, dashed
    styles = {"dense (S, P in HBM)": dict(line=dict(width=8, color="rgba(31, 119, 180, 0.4)"), marker=dict(size=12)),
              "gather + dense": dict(line=dict(width=2, dash="dash", color="#d62728"), marker=dict(symbol="x", size=7))}
    fig = go.Figure([go.Scatter(x=lengths, y=[roofline_s(attention_flops(n_, n_, D, HQ), table_bytes[n_][name]) * 1e3 for n_ in lengths],
                                name=name, mode="lines+markers", **styles.get(name, {})) for name in table_bytes[lengths[0]]])
    fig.add_trace(go.Scatter(x=lengths, y=[attention_flops(n_, n_, D, HQ) / H100.peak_flops_16bit * 1e3 for n_ in lengths],
                             name="compute roof alone (FLOPs / peak)", mode="lines", line=dict(dash="dot", color="black")))
    titled(fig, "One layer's attention for a prefill of n tokens: the roofline time of each kernel", clock_label=ROOFLINE)
    fig.update_layout(xaxis=dict(title="prompt length n (tokens)", type="log", tickvals=lengths), yaxis=dict(title="ms per layer (roofline bound)", type="log", dtick=1),
                      legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0), height=520)
    fig.show()
    for n_ in (8192,):
        for name, nbytes in kernels(n_).items():
            t = roofline_s(attention_flops(n_, n_, D, HQ), nbytes)
            print(f"n = {n_:,}: {name:50s} {nbytes / 1e9:7.2f} GB  {t * 1e3:7.3f} ms  "
                  f"{'memory' if nbytes / H100.memory_bandwidth > attention_flops(n_, n_, D, HQ) / H100.peak_flops_16bit else 'compute'}-bound")
    """),
    conclusion("""
    N = 8192
    kb = kernels(N)
    flops = attention_flops(N, N, D, HQ)
    dense_b, gather_b, one_b, tiled_b = kb.values()
    compute_s, bw = flops / H100.peak_flops_16bit, H100.memory_bandwidth
    conclude(f"Every toy count equals its formula. At **n = {N:,}** one layer does {flops / 1e9:.0f} GFLOP of attention, "
             f"{compute_s * 1e3:.2f} ms at the H100's peak. Dense attention moves **{dense_b / 1e9:.1f} GB** (the 32 heads' "
             f"{N:,} x {N:,} score and probability matrices, each written and read back): {dense_b / bw * 1e3:.1f} ms, memory-bound, "
             f"{dense_b / bw / compute_s:.0f}x the compute roof. One query per program re-reads each key for every query "
             f"({one_b / 1e9:.0f} GB if no cache kept them). Tiles of 128 queries sharing each K/V tile across the 4 heads of a KV head move "
             f"**{tiled_b / 1e9:.2f} GB**, {tiled_b / bw * 1e3:.2f} ms: under the compute time, so the kernel is compute-bound, which is "
             f"why FlashAttention is fast and not only frugal.",
             [("every formula equals the toy's count", all(f == cnt for f, cnt in toy_checks.values())),
              ("dense is memory-bound at 8k", dense_b / bw > compute_s),
              ("one query per program moves more than dense at 8k", one_b > dense_b),
              ("128-query GQA tiles are compute-bound at 8k", tiled_b / bw < compute_s),
              ("the gather only adds bytes", gather_b > dense_b)])
    """),
    md("""
    ### Decode: the same bytes, fewer programs
    For a decode (`n = 1`) the score row is only `c` numbers, so dense, tiled and split kernels move nearly the same
    bytes: the K/V, read once (the gather reads them three times). What differs is **parallelism**: a program runs on
    one SM. The figure uses a simple occupancy model, labelled as such: with `P` programs, at most `P` of the 132 SMs
    issue loads, so the kernel streams at most `min(1, P / 132)` of the bandwidth. FlashDecoding picks the split so
    that `batch x KV heads x splits` fills the SMs.
    """),
    code("""
    SMS = 132


    def decode_time_s(batch, c, splits):
        \"\"\"Roofline time of one layer's decode attention with split-K, if P programs stream at most P/132 of the bandwidth.\"\"\"
        programs = batch * HKV * splits
        nbytes = batch * HKV * (flash_bytes(1, c, D, q_tile=1, group=G) + splits * (D + 2) * G * 4 * 2)   # + partials, fp32, written and read
        return max(batch * attention_flops(1, c, D, HQ) / H100.peak_flops_16bit,
                   nbytes / (H100.memory_bandwidth * min(1.0, programs / SMS))), nbytes


    contexts = pick([1024, 4096, 16384, 32768, 131072], [1024, 8192, 32768, 131072])
    fill = math.ceil(SMS / HKV)          # splits that fill the SMs at batch 1
    fig = go.Figure()
    for batch, splits, dash in ((1, 1, "solid"), (1, fill, "dash"), (64, 1, "dot")):
        fig.add_trace(go.Scatter(x=contexts, y=[decode_time_s(batch, cx, splits)[0] * 1e3 / batch for cx in contexts],
                                 name=f"batch {batch}, {splits} split{'s' if splits > 1 else ''} ({batch * HKV * splits} programs)",
                                 mode="lines+markers", line=dict(dash=dash)))
    titled(fig, "Decode attention per request and layer: split-K fills the SMs at batch 1",
           clock_label=ROOFLINE + "; occupancy model: P programs stream at most P/132 of the bandwidth")
    fig.update_layout(xaxis=dict(title="context c (tokens)", type="log", tickvals=contexts), yaxis=dict(title="ms per request per layer", type="log", dtick=1))
    fig.show()
    """),
    conclusion("""
    C = 32768
    one_t, one_b = decode_time_s(1, C, 1)
    split_t, split_b = decode_time_s(1, C, fill)
    batch_t, _ = decode_time_s(64, C, 1)
    conclude(f"At batch 1 and {C:,} tokens of context, one program per KV head runs {HKV} programs on {SMS} SMs: "
             f"**{one_t * 1e6:.0f} us** per layer in this model. Split {fill} ways ({HKV * fill} programs) it takes **{split_t * 1e6:.1f} us**, "
             f"{one_t / split_t:.0f}x less, for {(split_b - one_b) / one_b:.2%} more bytes (the partials). A batch of 64 fills the SMs by itself "
             f"({64 * HKV} programs, {batch_t / 64 * 1e6:.1f} us per request): split-K is for small batches with long contexts.",
             [("splitting fills the SMs and cuts the time", split_t < one_t / 10),
              ("the partials add under 1 % of the bytes", (split_b - one_b) / one_b < 0.01),
              ("a batch of 64 needs no split", abs(batch_t / 64 - split_t) / split_t < 0.05)])
    """),
    md("""
    ### What the modelled clock charges for it
    The teaching clock prices attention as a kernel that reads each request's K/V once per step (a flash-style kernel at
    `attention_mbu` of the bandwidth; `minengine/timing/cost_model.py`). Its K/V bytes for a decode equal the tiled
    count above, over every layer plus writing the new token's K/V; and at long contexts those reads dominate a whole
    decode step of 64 requests:
    """),
    code("""
    h100 = teaching_cost_model()
    ours = h100.cost(StepWork.of([(1, 8191, 1)]))
    toy_kv = SHAPE.num_layers * HKV * (flash_bytes(1, 8192, D, q_tile=1, group=G) - 2 * (2 * D * G))   # K/V only: minus Q and O (bf16)
    new_kv = SHAPE.num_layers * HKV * 2 * D * 2                                                  # the new token's K and V written
    print(f"decode at 8,192 keys: cost model K/V bytes {ours.kv_bytes / 1e6:.2f} MB, tiled count {(toy_kv + new_kv) / 1e6:.2f} MB")
    steps = {f"64 decodes, {cx // 1024}k context": h100.cost(StepWork.of([(1, cx, 1)] * 64)) for cx in (1024, 32768)}
    titled(roofs_figure(steps), "Compute time and memory time of a 64-request decode step").show()
    for name, cst in steps.items():
        print(f"{name}: {cst.time_s * 1e3:5.1f} ms, attention {cst.attention_time_s * 1e3:5.1f} ms ({cst.attention_time_s / cst.time_s:.0%})")
    """),
    conclusion("""
    short, long_ = steps.values()
    conclude(f"The modelled clock's K/V bytes for one 8k decode ({ours.kv_bytes / 1e6:.1f} MB) are the tiled kernel's count exactly. "
             f"For a 64-request decode step attention is **{short.attention_time_s / short.time_s:.0%}** of the modelled step at 1k tokens of "
             f"context and **{long_.attention_time_s / long_.time_s:.0%}** at 32k: at long contexts the attention kernel, not the weights, is the step.",
             [("the cost model reads K/V once, as the tiled kernel", ours.kv_bytes == toy_kv + new_kv),
              ("attention's share grows with the context", short.attention_time_s / short.time_s < long_.attention_time_s / long_.time_s),
              ("at 32k attention is most of the step", long_.attention_time_s / long_.time_s > 0.5)])
    """),
    md("""
    ## The real things: the engine's two kernels
    Two kernels of the engine read a paged cache in place:
    - `minengine/layers/cpu_attention.cpp` (C++, compiled once per machine, in the background): per request and KV head, tiles of up to 4 query
      rows (the G heads of the KV head times the new tokens); it reads the keys in one pass, keeps the scores in
      per-thread scratch, takes an exact softmax, then reads the values in a second pass. A CPU's contexts are short
      enough to keep a row of scores, so it needs no online rescaling;
    - `minengine/layers/triton_attention.py` (Triton; CUDA, or the interpreter here): one program per query token and
      head, one pass over the blocks with the online softmax of Toy 3.

    One mixed step through both: a 3-token prefill chunk after 9 cached tokens, and two decodes (13 and 6 keys), with
    GQA (4 query heads, 2 KV heads), blocks of 4 scattered over a pool, against dense attention in float64:
    """),
    code("""
    from minengine.layers import cpu_attention
    from minengine.layers.triton_attention import triton_paged_attention

    torch.manual_seed(1)
    hq, hkv, hd, bs4, pool = 4, 2, 32, 4, 16
    seq_lens_list, q_lens = [12, 13, 6], [3, 1, 1]
    keys = [torch.randn(s, hkv, hd) for s in seq_lens_list]
    vals = [torch.randn(s, hkv, hd) for s in seq_lens_list]
    perm = torch.randperm(pool).tolist()
    tables = [perm[0:3], perm[3:7], perm[7:9]]
    kc, vc = torch.zeros(pool, bs4, hkv, hd), torch.zeros(pool, bs4, hkv, hd)
    for kk, vv, tb in zip(keys, vals, tables):
        for p_ in range(kk.shape[0]):
            kc[tb[p_ // bs4], p_ % bs4], vc[tb[p_ // bs4], p_ % bs4] = kk[p_], vv[p_]
    query = torch.randn(sum(q_lens), hq, hd)
    starts = [0, 3, 4, 5]

    reference = torch.zeros(query.shape, dtype=F64)          # dense attention, head by head (query head h reads KV head h // 2)
    for r, (s_len, q_len) in enumerate(zip(seq_lens_list, q_lens)):
        for h in range(hq):
            reference[starts[r]:starts[r + 1], h] = dense_attention(query[starts[r]:starts[r + 1], h].double(), keys[r][:, h // 2].double(),
                                                                    vals[r][:, h // 2].double(), HBM())

    width = max(map(len, tables))
    block_tables = torch.tensor([tb + [0] * (width - len(tb)) for tb in tables], dtype=torch.int32)
    t0 = time.perf_counter()
    triton_out = triton_paged_attention(query, kc, vc, block_tables, torch.tensor(starts, dtype=torch.int32),
                                        torch.tensor(seq_lens_list, dtype=torch.int32), hd ** -0.5)
    triton_s = time.perf_counter() - t0
    triton_error = (triton_out.double() - reference).abs().max().item()
    print(f"Triton kernel (interpreted, {sum(q_lens) * hq} programs, {triton_s:.1f} s wall): max |triton - dense| = {triton_error:.1e}")

    # The kernel is compiled once per machine, in the background while engines run the torch path; here we wait for it
    # (at most 3 minutes). None without a C++ compiler, with MINENGINE_CPU_KERNEL=0, or if its build failed.
    kernel = cpu_attention.get_kernel(timeout_s=180) if cpu_attention.applies(query.device, query.dtype, hd) else None
    cpp_error = None
    if kernel is not None:
        cpp_out = torch.empty_like(query)
        kernel(cpp_out[0:3], query[0:3], kc, vc, block_tables[0:1].long(), torch.tensor([12], dtype=torch.int32), 3, hd ** -0.5, 1)   # the chunk
        kernel(cpp_out[3:5], query[3:5], kc, vc, block_tables[1:3].long(), torch.tensor([13, 6], dtype=torch.int32), 1, hd ** -0.5, 1)  # the decodes
        cpp_error = (cpp_out.double() - reference).abs().max().item()
        print(f"C++ kernel: max |c++ - dense| = {cpp_error:.1e}")
    else:
        print(f"no C++ kernel here ({cpu_attention.status().message}): the engine's CPU path gathers and calls SDPA")
    """),
    conclusion("""
    checks = [("the Triton kernel equals dense attention (float32 rounding)", triton_error < 1e-5)]
    text = (f"Through a block table, with GQA, a prefill chunk after cached context and two decodes in one call, the engine's "
            f"**Triton kernel** equals dense attention to {triton_error:.0e} (float32)")
    if cpp_error is not None:
        checks.append(("the C++ kernel equals dense attention (float32 rounding)", cpp_error < 1e-5))
        text += f", and its **C++ CPU kernel** to {cpp_error:.0e}"
    else:
        text += "; the C++ kernel did not build here, so it was not checked"
    conclude(text + ". Two different algorithms (one pass with an online softmax; two passes with the scores kept), one answer.", checks)
    """),
    md("## Try it: the bytes of a prefill"),
    code("""
    import ipywidgets as widgets


    def prefill_bytes(n=8192, q_tile=128, group=4):
        flops = attention_flops(n, n, D, HQ)
        rows = {"dense": HQ * dense_bytes(n, n, D), f"tiled, {q_tile} queries x {group} heads": (HQ // group) * flash_bytes(n, n, D, q_tile, group)}
        for name, nbytes in rows.items():
            t = roofline_s(flops, nbytes)
            print(f"{name:28s} {nbytes / 1e9:8.2f} GB  {t * 1e3:7.3f} ms per layer  "
                  f"({'memory' if nbytes / H100.memory_bandwidth > flops / H100.peak_flops_16bit else 'compute'}-bound)")
        fig = go.Figure(go.Bar(x=list(rows), y=[b / 1e9 for b in rows.values()]))
        titled(fig, f"HBM bytes of one layer's attention, prefill of {n:,} tokens", clock_label=ROOFLINE)
        fig.update_layout(yaxis=dict(title="GB per layer", type="log", dtick=1))
        fig.show()


    widgets.interact_manual(prefill_bytes, n=widgets.SelectionSlider(options=[512, 2048, 8192, 32768], value=8192),
                            q_tile=widgets.Dropdown(options=[1, 16, 64, 128, 256], value=128), group=widgets.Dropdown(options=[1, 2, 4], value=4))
    """),
    *exercise(1, """
        Write `answer_1(n, c, d)`: the bytes dense attention (Toy 1, bf16) moves for `n` queries over `c` keys with head dim
        `d`. The check runs `dense_attention` with the counting memory on several shapes, decodes and prefills.
        """, "Q, K, V and O cross once each; S and P are `n x c` and each is written once and read once.", "answer_1",
        "answer_1 = lambda n, c, d: 2 * (2 * n * d + 2 * c * d + 4 * n * c)",
        """
        def counted_dense(n, c, d):
            hbm = HBM()
            dense_attention(torch.randn(n, d, dtype=F64), torch.randn(c, d, dtype=F64), torch.randn(c, d, dtype=F64), hbm)
            return hbm.total


        shapes = [(1, 100, 16), (40, 100, 16), (64, 64, 32), (7, 300, 8), (128, 128, 128)]
        check_function("Exercise 1: bytes of dense attention", answer_1, [(s, counted_dense(*s)) for s in shapes])
        """, wrong=["answer_1 = lambda n, c, d: 2 * (2 * n * d + 2 * c * d + 2 * n * c)  # S and P are each written AND read back",
                    "answer_1 = lambda n, c, d: 2 * n * d + 2 * c * d + 4 * n * c  # elements, not bytes (bf16: 2 each)",
                    "answer_1 = lambda n, c, d: 2 * (4 * n * d + 4 * n * c)  # right only when n == c",
                    "answer_1 = lambda n, c, d: 2 * (2 * n * d + 2 * c * d)  # forgot the score matrices"]),
    *exercise(2, """
        Write `answer_2(parts)`: the exact attention output of one decode row from its split-K partials, a list of
        `(m, l, acc)` (the split's max score, its sum of `exp(s - m)`, its sum of `exp(s - m) v`, as `split_k_partials`
        returns). The check compares it with dense attention on several rows, contexts and split counts.
        """, "Bring every split to the common max `M = max(m)`: multiply its `l` and `acc` by `exp(m - M)`, then divide.", "answer_2",
        """
        def answer_2(parts):
            top = max(m for m, _, _ in parts)
            total = sum(l * math.exp(m - top) for m, l, _ in parts)
            return sum(acc * math.exp(m - top) for m, _, acc in parts) / total
        """,
        """
        def merge_is_exact(merge):
            if not callable(merge):
                return merge
            def case(seed, c_keys, splits):
                g = torch.Generator().manual_seed(seed)
                kk, vv = torch.randn(c_keys, d, dtype=F64, generator=g) * 2, torch.randn(c_keys, d, dtype=F64, generator=g)
                qq = 3 * torch.randn(1, d, dtype=F64, generator=g)
                tb = torch.randperm(POOL, generator=g)[: math.ceil(c_keys / BS)]
                kc_, vc_ = torch.zeros(POOL, BS, d, dtype=F64), torch.zeros(POOL, BS, d, dtype=F64)
                for p_ in range(c_keys):
                    kc_[tb[p_ // BS], p_ % BS], vc_[tb[p_ // BS], p_ % BS] = kk[p_], vv[p_]
                got = merge(split_k_partials(qq, kc_, vc_, tb, c_keys, splits, HBM()))
                return bool(torch.allclose(torch.as_tensor(got, dtype=F64).reshape(-1), dense_attention(qq, kk, vv, HBM())[0], atol=1e-10))
            return case


        cases = [((seed, c_keys, splits), True) for seed, c_keys, splits in ((0, 256, 4), (1, 100, 3), (2, 37, 2), (3, 512, 8))]
        check_function("Exercise 2: merging split-K partials", merge_is_exact(answer_2), cases)
        """, wrong=["answer_2 = lambda parts: sum(acc / l for m, l, acc in parts) / len(parts)  # the mean of the splits' outputs weighs every split alike",
                    "answer_2 = lambda parts: sum(acc for m, l, acc in parts) / sum(l for m, l, acc in parts)  # each split is scaled by its own max",
                    "answer_2 = lambda parts: max(parts, key=lambda p: p[0])[2] / max(parts, key=lambda p: p[0])[1]  # only the split with the largest score"]),
    *exercise(3, """
        Arithmetic intensity of decode attention: FLOPs per byte of K/V read, as a function `answer_3(group, kv_bytes)` of
        the GQA group size (query heads per KV head) and the bytes per K/V element. Every key costs `4 d` FLOPs per query
        head and `2 d` elements (its K and its V) per KV head. The check reads the modelled clock's attention FLOPs and K/V
        bytes for a long decode on four model shapes and cache dtypes (ratios rounded to 2 decimals).
        """, "Per KV head and key: the G query heads do 4 d FLOPs each; K and V are 2 d elements of kv_bytes each.", "answer_3",
        "answer_3 = lambda group, kv_bytes: 2 * group / kv_bytes",
        """
        from minengine.timing import StepCostModel
        from minengine.timing.model_shape import LLAMA_2_7B, LLAMA_3_70B

        def model_intensity(shape):
            cst = StepCostModel("h100", shape).cost(StepWork.of([(1, 200_000, 1)]))
            return round(cst.attention_flops / cst.kv_bytes, 2)

        variants = [LLAMA_3_8B, LLAMA_3_8B.with_(kv_dtype_bytes=1), LLAMA_3_70B, LLAMA_2_7B]
        cases = [((s.num_heads // s.num_kv_heads, s.kv_dtype_bytes or s.dtype_bytes), model_intensity(s)) for s in variants]
        rounded = answer_3 if not callable(answer_3) else (lambda g, b: round(answer_3(g, b), 2))
        check_function("Exercise 3: intensity of decode attention", rounded, cases)
        """, wrong=["answer_3 = lambda group, kv_bytes: group  # right for bf16 only: the bytes per element count",
                    "answer_3 = lambda group, kv_bytes: 4 * group / kv_bytes  # V is read too, not only K",
                    "answer_3 = lambda group, kv_bytes: 2 / kv_bytes  # the G query heads of a KV head share each key read"]),
    *question("why is FlashAttention exact, when it never sees a whole row of scores?", """
        The tiled kernel computed each softmax from pieces, one block at a time. Why is the result the exact softmax (to
        rounding), and not an approximation like sparse or low-rank attention?
        """, """
        Softmax is `exp(s_j - M) / sum_i exp(s_i - M)` for any constant `M`; the max is there so the exponentials do not overflow. The running state keeps `l` and `acc` relative to the max seen so far, and when a larger max arrives it
        multiplies both by `exp(m_old - m_new)`, which turns sums relative to the old max into sums relative to the new one
        exactly (checked: the running sum was rescaled when the max rose). After the last block, `acc / l` is the same ratio the one-shot softmax computes. Nothing is dropped or
        estimated; only the order of additions changes, so results differ by floating-point rounding (checked: flash equals dense to float64 rounding). Approximate methods (sparse, low-rank) change *which* scores count; FlashAttention changes *where* they are kept, not which (checked: flash equals dense to float64 rounding).
        """),
    *question("what if a kernel kept the scores instead, as the engine's C++ kernel does?", """
        The C++ kernel makes two passes (keys, then values) and keeps a row of scores in scratch, with no online rescaling.
        Why is that fine on a CPU at the engine's contexts, and why would it not be on a GPU for a 32k-token prefill?
        """, """
        A row of scores is `c` floats per query row: 4 rows x 8k keys x 4 bytes = 128 KB, which fits a CPU core's L2 cache, so
        the second pass reads scores from cache, not from memory, and the exact two-pass softmax costs no extra DRAM traffic
        while avoiding the rescaling arithmetic. A GPU's SRAM is about 228 KB per SM shared by all the threads of many query
        rows (source: NVIDIA Hopper tuning guide); a tile of 128 queries x 32k keys of scores would be 16 MB. It would spill to HBM, which is Toy 1's cost again.
        The online softmax is what lets a GPU tile stay in SRAM whatever the context.
        """),
    *question("why does FlashDecoding not help a batch of 256 decodes?", """
        Split-K gave a large gain at batch 1. Would it help a batch of 256 requests with 4k-token contexts?
        """, """
        Hardly. A batch of 256 already has 256 x 8 KV heads = 2,048 programs for 132 SMs, so the bandwidth is already
        saturated without splitting; more splits add partial results to write and merge and one more kernel launch (checked: a batch of 64 needs no split). The
        bytes (each request's K/V, read once) are the same either way. FlashDecoding targets few requests with long
        contexts, where too few programs leave most SMs idle.
        """),
    *summary([
        "Dense attention writes and reads back the n x c scores and probabilities: Θ(n²) HBM bytes, memory-bound for long prompts.",
        "A paged cache can be read by gathering the blocks into a copy (more bytes) or in place through the block table (vLLM's kernels, the engine's C++ and Triton kernels) (checked: the gather only adds bytes).",
        "FlashAttention tiles the queries and streams the key blocks through SRAM with a running max and a running sum: the exact softmax, without the score matrix in HBM; tiles of many queries (and the heads of a GQA group) make it compute-bound.",
        "A decode reads each key once whatever the kernel; at small batch and long context FlashDecoding splits the keys over more programs to fill the SMs, and merges the partials with the same rescaling (checked: splitting fills the SMs and cuts the time).",
        "The modelled clock charges attention as a flash-style kernel: K/V read once per step, which dominates a decode step at long context (checked: at 32k attention is most of the step).",
    ]),
    *glossary([
        ("FlashAttention", "FlashAttention（闪存注意力）", "tiled exact attention with an online softmax; the scores never reach HBM"),
        ("online softmax", "在线 softmax", "softmax computed block by block with a running max and a running sum"),
        ("running max / running sum", "运行最大值 / 运行和", "the state kept per query row between key blocks"),
        ("tile", "分片（tile）", "the part of the queries or keys a program holds in SRAM at once"),
        ("split-K / FlashDecoding", "K 维拆分 / FlashDecoding", "cutting a decode's keys over several programs and merging their partials"),
        ("HBM / SRAM", "高带宽显存 / 片上 SRAM", "the GPU's large, slower memory / its small on-chip memory"),
        ("arithmetic intensity", "算术强度", "FLOPs per byte moved; above the ridge point a kernel is compute-bound"),
        ("GQA", "分组查询注意力", "several query heads share one KV head"),
    ]),
]

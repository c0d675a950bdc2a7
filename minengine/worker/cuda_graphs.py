"""Decode steps replayed from CUDA graphs: one graph per padded batch size, inputs copied into static buffers.

Why: a decode step of a small model on a GPU is hundreds of tiny kernels; launching them one by one from
Python costs more than running them. A CUDA graph records the launches once and replays them with one call
(vLLM's ``CUDAGraphRunner`` / ``cudagraph_capture_sizes``; SGLang's ``CudaGraphRunner``). A graph replays the
same kernels on the same memory, so the step's inputs are copied into static buffers, and a batch of B
decodes runs the graph captured for the smallest capture size >= B, the extra rows padded: they read and
write one reserved KV block (``pad_block``) that no request owns, and their outputs are dropped. Steps with a
prefill chunk, more requests than the largest size, or longer block tables than the buffers run eagerly.

Graphs need the Triton attention (its metadata are plain tensors of fixed shape; the torch path plans groups
on the host). With ``capture=False`` the same padded static-buffer path runs eagerly: that is how the padding
is tested on a CPU (Triton interpreter), and a way to debug a graph.
"""

from __future__ import annotations

import bisect

import torch

from minengine.worker.forward_batch import ForwardBatch

# vLLM's default capture sizes start 1, 2, 4 and go up in steps of 8; a coarser ladder keeps capture short.
DEFAULT_CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)


def capture_sizes_for(max_batch: int, sizes: tuple[int, ...] = DEFAULT_CAPTURE_SIZES) -> list[int]:
    """The capture sizes up to ``max_batch``, with ``max_batch`` itself added so every B <= max_batch has one.

    Raises:
        ValueError: max_batch < 1.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    out = sorted({s for s in sizes if 1 <= s <= max_batch} | {max_batch})
    return out


def padded_size(num_requests: int, sizes: list[int]) -> int | None:
    """The smallest capture size >= ``num_requests`` (sizes sorted ascending), or None when none is."""
    i = bisect.bisect_left(sizes, num_requests)
    return sizes[i] if i < len(sizes) else None


class DecodeGraphs:
    """Static input buffers for decode-only steps of up to ``max(sizes)`` requests and their CUDA graphs.

    Args:
        model: the model (``forward(batch, kv_caches) -> hidden``).
        kv_caches: the runner's KV caches (the graphs capture their addresses).
        block_size: tokens per KV block.
        max_blocks_per_seq: width of the static block table (longer tables run eagerly).
        pad_block: a KV block id no request ever gets; padded rows write their K/V there.
        sizes: capture sizes (``capture_sizes_for``).
        capture: record CUDA graphs (CUDA only); False runs the padded static buffers eagerly.

    Attributes:
        num_replays, num_eager_fallbacks: counters (for tests and benchmarks).
    """

    def __init__(self, model, kv_caches, block_size: int, max_blocks_per_seq: int, pad_block: int,
                 sizes: list[int], capture: bool):
        self.model, self.kv_caches = model, kv_caches
        self.block_size, self.pad_block = block_size, pad_block
        self.sizes = sorted(sizes)
        self.capture = capture
        device = next(model.parameters()).device
        if capture and device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device (use capture=False elsewhere)")
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), pad_block * block_size, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)  # one token per request
        self.block_tables = torch.full((n, max_blocks_per_seq), pad_block, dtype=torch.int32, device=device)
        self._batches: dict[int, ForwardBatch] = {}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._pool = None
        self.num_replays = self.num_eager_fallbacks = 0

    def supports(self, batch: ForwardBatch) -> bool:
        """A decode-only step whose size and block tables fit the static buffers."""
        num_reqs = batch.seq_lens.shape[0]
        return (batch.block_tables is not None and batch.num_decodes == num_reqs == batch.num_tokens
                and num_reqs <= self.sizes[-1] and batch.block_tables.shape[1] <= self.block_tables.shape[1])

    def static_batch(self, size: int) -> ForwardBatch:
        """The ForwardBatch over the first ``size`` rows of the static buffers (what a graph replays)."""
        if size not in self._batches:
            self._batches[size] = ForwardBatch(
                input_ids=self.input_ids[:size], positions=self.positions[:size],
                slot_mapping=self.slot_mapping[:size], query_start_loc=self.query_start_loc[:size + 1],
                seq_lens=self.seq_lens[:size], logits_indices=torch.arange(size), batch_order=None, first_rows=None,
                block_size=self.block_size, block_tables=self.block_tables[:size], num_decodes=size,
                attention_backend="triton")
        return self._batches[size]

    def load(self, batch: ForwardBatch, size: int) -> None:
        """Copy a step's inputs into rows 0..B-1 and reset rows B..size-1 to padding (a row left over from a
        larger step would otherwise write its K/V into a block a request owns now)."""
        b = batch.num_tokens
        width = batch.block_tables.shape[1]
        self.input_ids[:b].copy_(batch.input_ids)
        self.positions[:b].copy_(batch.positions)
        self.slot_mapping[:b].copy_(batch.slot_mapping)
        self.seq_lens[:b].copy_(batch.seq_lens)
        self.block_tables[:b, :width].copy_(batch.block_tables)
        self.pad_rows(b, size)

    def pad_rows(self, start: int, end: int) -> None:
        """Rows start..end-1 become padding: token 0 at position 0, 1 key, K/V slot and block = ``pad_block``."""
        self.input_ids[start:end] = 0
        self.positions[start:end] = 0
        self.slot_mapping[start:end] = self.pad_block * self.block_size
        self.seq_lens[start:end] = 1
        self.block_tables[start:end, 0] = self.pad_block

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """The step's final hidden states [B, hidden] (rows in the batch's order), from the graph of the
        padded size (captured on first use) or, with ``capture=False``, from an eager forward on the same
        padded static buffers."""
        size = padded_size(batch.num_tokens, self.sizes)
        if self.capture and size not in self._graphs:
            self._capture(size)
        self.load(batch, size)
        if self.capture:
            self._graphs[size].replay()
            out = self._outputs[size]
        else:
            out = self.model(self.static_batch(size), self.kv_caches)
        self.num_replays += 1
        return out[:batch.num_tokens]

    def _capture(self, size: int) -> None:
        """Record the forward of ``size`` padding rows (it only touches ``pad_block``). Warm-up runs on a
        side stream first (compiles Triton, initialises cuBLAS), as ``torch.cuda.graph`` requires."""
        self.pad_rows(0, size)
        batch = self.static_batch(size)
        with torch.inference_mode():  # as ``ModelRunner.execute``: no autograd state recorded
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.model(batch, self.kv_caches)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self.model(batch, self.kv_caches)
        self._pool = graph.pool()  # graphs of all sizes share one memory pool
        self._graphs[size], self._outputs[size] = graph, out

    def capture_all(self) -> None:
        """Capture every size now, largest first (later, smaller graphs reuse the shared pool's memory), as
        vLLM does at start-up (``ModelRunner`` calls it); a size not captured yet is captured on first use."""
        if self.capture:
            for size in reversed(self.sizes):
                if size not in self._graphs:
                    self._capture(size)

    @property
    def captured_sizes(self) -> list[int]:
        return sorted(self._graphs)

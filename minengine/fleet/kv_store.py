"""The fleet's KV store: a cluster-wide pool of full KV blocks in the nodes' CPU memory (and optionally SSD), keyed by
the engine's own block hashes, that every replica writes to and any replica can load a prefix from.

Mooncake (Qin et al., "Mooncake: Trading More Storage for Less Computation", FAST 2025, sections 3-4) pools the
otherwise idle DRAM and SSD of the GPU nodes into a disaggregated KV cache: every prefill's blocks are stored, and a
prefill on any node fetches the longest stored prefix over RDMA instead of recomputing it, when that is cheaper.
Here:

- **Nodes.** Replicas are packed onto nodes of ``gpus_per_node`` GPUs in index order (a replica of ``tp`` GPUs takes
  ``tp`` of them). Each node holds ``dram_bytes_per_node`` of blocks and, optionally, ``ssd_bytes_per_node`` more.
- **Keys.** A block is stored under the engine's chained hash (``minengine.core.kv_cache_manager.hash_block``), so a
  stored hash stands for the block *and every block before it*, exactly as in a replica's prefix cache: a lookup walks
  a prompt's hashes from a start block and stops at the first one the store lacks. One copy per hash in the whole
  store (a second write of a stored block only refreshes it).
- **Eviction.** LRU per node and per tier: a block written, re-written or loaded becomes the node's most recently
  used DRAM block (a block loaded from SSD moves back to DRAM); when DRAM is full its least recently used block moves
  to the node's SSD (if it has one) or leaves the store, and when SSD is full its least recently used block leaves.
  The blocks of one write or load are used tail first, so a prompt's head is evicted after its tail (as the engine's
  ``BlockPool`` frees them): without its head a stored tail is unreachable.
- **Writes** (``write``): after each step a replica writes the prompt blocks that step completed to its own node's
  DRAM over its host link (PCIe: ``local_bandwidth``, default the GPU's ``host_link_bandwidth``), one write at a time
  per replica; a block becomes visible to lookups only when its write has finished.
- **Loads** (``plan_load`` / ``start_load``): a prefix continuing the replica's local prefix hit, block by block
  from wherever it is: the replica's own node over the host link, another node over ``link`` (RDMA, one NIC per GPU,
  so ``tp`` lanes), SSD blocks at most at ``ssd_bandwidth`` of their node; one load at a time per replica. The
  simulator starts a load only when it ends before recomputing those tokens would (``Replica.prefill_time_s``).

Times are seconds, sizes bytes, counts blocks of ``block_size`` tokens.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from minengine.fleet.links import KVLink, get_link

DRAM, SSD = 0, 1


@dataclass(frozen=True)
class KVStoreConfig:
    """Where the store keeps blocks and how fast they move.

    Attributes:
        dram_bytes_per_node: CPU memory each node gives the store, bytes (> 0). Default 1 TB: half of a DGX H100's
            2 TB, the rest left to the host.
        ssd_bytes_per_node: SSD each node gives the store, bytes (0: no SSD tier).
        gpus_per_node: GPUs per node (a DGX H100 has 8); replicas fill nodes in index order.
        link: between nodes (a ``LINKS`` name or a ``KVLink``), per GPU: a replica of ``tp`` GPUs loads over ``tp``
            lanes (Mooncake's Transfer Engine uses every NIC of a node).
        local_bandwidth: host memory <-> GPU within a node, bytes/s per GPU; None: the GPU's ``host_link_bandwidth``
            (PCIe Gen5 x16 on an H100, 64 GB/s).
        ssd_bandwidth: read/write bandwidth of a node's SSDs, bytes/s (7 GB/s: one PCIe Gen4 NVMe drive).
        ssd_latency_s: added once to a load that reads any SSD block, seconds.

    Raises:
        ValueError: naming the field, for a value out of range or an unknown link.
    """

    dram_bytes_per_node: float = 1e12
    ssd_bytes_per_node: float = 0.0
    gpus_per_node: int = 8
    link: str | KVLink = "ib-400g"
    local_bandwidth: float | None = None
    ssd_bandwidth: float = 7e9
    ssd_latency_s: float = 100e-6

    def __post_init__(self) -> None:
        def number(name: str, v, low: float, strict: bool) -> None:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or (v <= low if strict else v < low):
                raise ValueError(f"KVStoreConfig.{name} must be a finite number {'>' if strict else '>='} {low:g}, "
                                 f"got {v!r}")

        number("dram_bytes_per_node", self.dram_bytes_per_node, 0, strict=True)
        number("ssd_bytes_per_node", self.ssd_bytes_per_node, 0, strict=False)
        number("ssd_bandwidth", self.ssd_bandwidth, 0, strict=True)
        number("ssd_latency_s", self.ssd_latency_s, 0, strict=False)
        if self.local_bandwidth is not None:
            number("local_bandwidth", self.local_bandwidth, 0, strict=True)
        g = self.gpus_per_node
        if not isinstance(g, int) or isinstance(g, bool) or g < 1:
            raise ValueError(f"KVStoreConfig.gpus_per_node must be a positive integer, got {g!r}")
        object.__setattr__(self, "link", get_link(self.link))

    def describe(self) -> str:
        """"1 TB DRAM + 4.0 TB SSD per 8-GPU node, 400 Gb/s InfiniBand between nodes" (GB below 1 TB)."""
        def size(b: float) -> str:
            return f"{b / 1e12:.2g} TB" if b >= 1e12 else f"{b / 1e9:,.3g} GB"

        ssd = f" + {self.ssd_bytes_per_node / 1e12:.1f} TB SSD" if self.ssd_bytes_per_node else ""
        return (f"{size(self.dram_bytes_per_node)} DRAM{ssd} per {self.gpus_per_node}-GPU node, "
                f"{self.link.name} between nodes")


@dataclass(frozen=True)
class LoadPlan:
    """A load the store can do now: blocks ``[first, end)`` of a prompt to ``replica``, from ``start_s`` (its
    link is free) to ``end_s``; ``num_bytes`` in all, ``num_remote`` blocks from other nodes, ``num_ssd`` from SSD."""

    replica: int
    first: int
    end: int
    start_s: float
    end_s: float
    num_bytes: float
    num_remote: int
    num_ssd: int
    hashes: tuple[bytes, ...] = field(repr=False, default=())

    @property
    def num_blocks(self) -> int:
        return self.end - self.first


@dataclass
class StoreStats:
    """What the store did over a run (blocks of ``block_size`` tokens, bytes, seconds) and its sampled timeline.

    Attributes:
        num_loads, loaded_blocks, loaded_bytes: loads started and what they moved; ``remote_blocks`` came from
            another node, ``ssd_blocks`` from SSD; ``load_time_s``: seconds of transfer, ``load_wait_s``: seconds
            loads waited for the replica's link.
        declined_loads, declined_blocks: the store held a continuation of the local prefix but recomputing was
            cheaper (or the replica had no free blocks for it).
        used_blocks: loaded blocks that were part of the request's prefix hit when the engine admitted it;
            ``wasted_blocks``: the others (evicted from the replica's cache before admission, or not inserted).
        num_writes, written_blocks, written_bytes: writes of newly computed blocks; ``refreshed_blocks``: blocks
            written again while stored (only their LRU place changes).
        demoted_blocks: DRAM -> SSD; ``dropped_blocks``: evicted from the store.
        dram_capacity_blocks, ssd_capacity_blocks: per node; ``num_nodes``; ``peak_dram_blocks``, ``peak_ssd_blocks``:
            over all nodes.
        times, dram_blocks, ssd_blocks, loads_in_flight: the timeline (seconds; blocks over all nodes; loads).
    """

    block_size: int
    block_bytes: int
    num_nodes: int
    dram_capacity_blocks: int
    ssd_capacity_blocks: int
    num_loads: int = 0
    loaded_blocks: int = 0
    loaded_bytes: float = 0.0
    remote_blocks: int = 0
    ssd_blocks: int = 0
    load_time_s: float = 0.0
    load_wait_s: float = 0.0
    declined_loads: int = 0
    declined_blocks: int = 0
    used_blocks: int = 0
    wasted_blocks: int = 0
    num_writes: int = 0
    written_blocks: int = 0
    written_bytes: float = 0.0
    refreshed_blocks: int = 0
    demoted_blocks: int = 0
    dropped_blocks: int = 0
    peak_dram_blocks: int = 0
    peak_ssd_blocks: int = 0
    times: list[float] = field(default_factory=list, repr=False)
    dram_blocks: list[int] = field(default_factory=list, repr=False)
    ssd_blocks_used: list[int] = field(default_factory=list, repr=False)
    loads_in_flight: list[int] = field(default_factory=list, repr=False)

    @property
    def used_tokens(self) -> int:
        """Prompt tokens served from the store (loaded blocks hit at admission)."""
        return self.used_blocks * self.block_size

    @property
    def dram_capacity_bytes(self) -> float:
        return self.num_nodes * self.dram_capacity_blocks * self.block_bytes


class KVStore:
    """The store of one fleet run (see the module docstring).

    Args:
        config: capacities and bandwidths.
        block_size: tokens per block; ``block_bytes``: KV bytes of one block over the whole replica (all layers, all
            ``tp`` GPUs: ``block_size x ModelShape.kv_bytes_per_token``).
        replica_gpus: ``tp`` of each replica, in index order (places replicas on nodes, and is each one's lanes).
        host_link_bandwidths: each replica's GPU host link, bytes/s (used when ``config.local_bandwidth`` is None).

    Raises:
        ValueError: a node that cannot hold one block; mismatched lists.
    """

    def __init__(self, config: KVStoreConfig, block_size: int, block_bytes: int, replica_gpus: Sequence[int],
                 host_link_bandwidths: Sequence[float]):
        if len(replica_gpus) != len(host_link_bandwidths) or not replica_gpus:
            raise ValueError("replica_gpus and host_link_bandwidths must be non-empty and of equal length")
        self.config = config
        self.block_size = block_size
        self.block_bytes = block_bytes
        offsets, gpu = [], 0
        for tp in replica_gpus:
            offsets.append(gpu // config.gpus_per_node)
            gpu += tp
        self.replica_node = offsets
        self.replica_lanes = list(replica_gpus)
        self._local_bw = [(config.local_bandwidth or bw) * lanes for bw, lanes in zip(host_link_bandwidths,
                                                                                       replica_gpus)]
        link = config.link
        self._remote_bw = [link.bandwidth * link.efficiency * lanes for lanes in replica_gpus]
        self.num_nodes = -(-gpu // config.gpus_per_node)
        self.dram_capacity = int(config.dram_bytes_per_node // block_bytes)
        self.ssd_capacity = int(config.ssd_bytes_per_node // block_bytes)
        if self.dram_capacity < 1:
            raise ValueError(f"KVStoreConfig.dram_bytes_per_node ({config.dram_bytes_per_node:g} B) holds no block "
                             f"of {block_bytes:,} B")
        self._dram: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in range(self.num_nodes)]
        self._ssd: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in range(self.num_nodes)]
        self._where: dict[bytes, int] = {}  # hash -> node * 2 + tier
        self._pending: list[tuple[float, int, int, tuple[bytes, ...]]] = []  # writes in flight: (done, seq, node, ..)
        self._writing: set[bytes] = set()
        self._seq = 0
        self._load_free = [0.0] * len(replica_gpus)  # when each replica's link finishes its last load
        self._write_free = [0.0] * len(replica_gpus)
        self.num_dram = 0
        self.num_ssd = 0
        self.loads_in_flight = 0
        self.stats = StoreStats(block_size, block_bytes, self.num_nodes, self.dram_capacity, self.ssd_capacity)
        self._times = array("d")
        self._dram_t = array("l")
        self._ssd_t = array("l")
        self._loads_t = array("l")

    # ---- contents ---------------------------------------------------------------------------------------------
    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._where

    def __len__(self) -> int:
        return len(self._where)

    def tier_of(self, block_hash: bytes) -> tuple[int, int] | None:
        """(node, tier) of a stored block (tier ``DRAM`` = 0 or ``SSD`` = 1), None when not stored."""
        loc = self._where.get(block_hash)
        return None if loc is None else (loc >> 1, loc & 1)

    def node_blocks(self, node: int, tier: int = DRAM) -> list[bytes]:
        """The hashes a node holds in ``tier``, least recently used first."""
        return list((self._dram if tier == DRAM else self._ssd)[node])

    def advance(self, now: float) -> None:
        """Finish every write that ends at or before ``now`` (seconds): its blocks become visible."""
        pending = self._pending
        while pending and pending[0][0] <= now:
            _, _, node, hashes = heapq.heappop(pending)
            for h in hashes:
                self._writing.discard(h)
                if h in self._where:
                    self._refresh(h)
                else:
                    self._insert(node, h)

    def prefix_blocks(self, hashes: Sequence[bytes], first: int, end: int, now: float) -> int:
        """How many consecutive blocks ``hashes[first:end]`` the store holds at ``now`` (pure: no LRU change)."""
        self.advance(now)
        where, n = self._where, 0
        for i in range(first, min(end, len(hashes))):
            if hashes[i] not in where:
                break
            n += 1
        return n

    # ---- moves ------------------------------------------------------------------------------------------------
    def _insert(self, node: int, h: bytes) -> None:
        dram = self._dram[node]
        dram[h] = None
        self._where[h] = node << 1
        self.num_dram += 1
        if len(dram) > self.dram_capacity:
            victim, _ = dram.popitem(last=False)
            self.num_dram -= 1
            if self.ssd_capacity:
                ssd = self._ssd[node]
                ssd[victim] = None
                self._where[victim] = (node << 1) | SSD
                self.num_ssd += 1
                self.stats.demoted_blocks += 1
                if len(ssd) > self.ssd_capacity:
                    dropped, _ = ssd.popitem(last=False)
                    del self._where[dropped]
                    self.num_ssd -= 1
                    self.stats.dropped_blocks += 1
            else:
                del self._where[victim]
                self.stats.dropped_blocks += 1
        s = self.stats
        s.peak_dram_blocks = max(s.peak_dram_blocks, self.num_dram)
        s.peak_ssd_blocks = max(s.peak_ssd_blocks, self.num_ssd)

    def _refresh(self, h: bytes) -> None:
        """``h`` was used: it becomes its node's most recently used DRAM block (from SSD: moved back to DRAM)."""
        loc = self._where[h]
        node = loc >> 1
        if loc & 1:
            del self._ssd[node][h]
            self.num_ssd -= 1
            self._insert(node, h)
        else:
            self._dram[node].move_to_end(h)

    def write(self, replica: int, hashes: Sequence[bytes], now: float) -> float:
        """``replica`` finished computing these blocks at ``now``: write the new ones to its node's DRAM over its
        host link (after its previous write); blocks already stored are refreshed. Returns when the write ends."""
        self.advance(now)
        new = []
        for h in reversed(hashes):  # tail first: a prompt's head becomes the most recently used (evicted last)
            if h in self._where:
                self._refresh(h)
                self.stats.refreshed_blocks += 1
            elif h not in self._writing:
                new.append(h)
        if not new:
            return now
        self._writing.update(new)
        nbytes = len(new) * self.block_bytes
        start = max(now, self._write_free[replica])
        done = start + nbytes / self._local_bw[replica]
        self._write_free[replica] = done
        heapq.heappush(self._pending, (done, self._seq, self.replica_node[replica], tuple(new)))
        self._seq += 1
        s = self.stats
        s.num_writes += 1
        s.written_blocks += len(new)
        s.written_bytes += nbytes
        return done

    def load_seconds(self, replica: int, hashes: Sequence[bytes]) -> tuple[float, int, int]:
        """Transfer seconds of these stored blocks to ``replica`` (blocks one after another on its link, each at
        the bandwidth of its path), and how many are remote and on SSD. Raises ``KeyError`` for a block not
        stored."""
        node, block = self.replica_node[replica], self.block_bytes
        local_bw, remote_bw, ssd_bw = self._local_bw[replica], self._remote_bw[replica], self.config.ssd_bandwidth
        seconds, remote, ssd = 0.0, 0, 0
        for h in hashes:
            loc = self._where[h]
            far = (loc >> 1) != node
            bw = remote_bw if far else local_bw
            if loc & 1:
                bw = min(bw, ssd_bw)
                ssd += 1
            remote += far
            seconds += block / bw
        if remote:
            seconds += self.config.link.latency_s
        if ssd:
            seconds += self.config.ssd_latency_s
        return seconds, remote, ssd

    def plan_load(self, replica: int, hashes: Sequence[bytes], first: int, end: int, now: float) -> LoadPlan | None:
        """The load of the stored continuation of ``hashes`` from block ``first`` (at most to ``end``) to
        ``replica``, starting when its link is free; None when the store holds no such block. Changes nothing."""
        n = self.prefix_blocks(hashes, first, end, now)
        if n == 0:
            return None
        blocks = tuple(hashes[first:first + n])
        seconds, remote, ssd = self.load_seconds(replica, blocks)
        start = max(now, self._load_free[replica])
        return LoadPlan(replica, first, first + n, start, start + seconds, n * self.block_bytes, remote, ssd, blocks)

    def start_load(self, plan: LoadPlan, now: float) -> None:
        """Start ``plan`` (made at ``now``): its replica's link is busy until ``plan.end_s``; its blocks are used
        (most recently used, SSD blocks back in DRAM); the load is counted."""
        self._load_free[plan.replica] = plan.end_s
        for h in reversed(plan.hashes):  # tail first, as ``write``
            if h in self._where:
                self._refresh(h)
        self.loads_in_flight += 1
        s = self.stats
        s.num_loads += 1
        s.loaded_blocks += plan.num_blocks
        s.loaded_bytes += plan.num_bytes
        s.remote_blocks += plan.num_remote
        s.ssd_blocks += plan.num_ssd
        s.load_time_s += plan.end_s - plan.start_s
        s.load_wait_s += plan.start_s - now

    def load_done(self) -> None:
        """A load started with ``start_load`` has reached its replica."""
        self.loads_in_flight -= 1

    def decline(self, num_blocks: int) -> None:
        """A load of ``num_blocks`` was possible but not started (recomputing was cheaper)."""
        self.stats.declined_loads += 1
        self.stats.declined_blocks += num_blocks

    # ---- timeline ---------------------------------------------------------------------------------------------
    def sample(self, now: float) -> None:
        """Record the store's state at ``now`` (after finishing the writes due by then)."""
        self.advance(now)
        self._times.append(now)
        self._dram_t.append(self.num_dram)
        self._ssd_t.append(self.num_ssd)
        self._loads_t.append(self.loads_in_flight)

    def finish(self) -> StoreStats:
        """End of the run: finish every write, and return the ``StoreStats`` with the timeline."""
        self.advance(math.inf)
        s = self.stats
        s.times, s.dram_blocks = list(self._times), list(self._dram_t)
        s.ssd_blocks_used, s.loads_in_flight = list(self._ssd_t), list(self._loads_t)
        return s

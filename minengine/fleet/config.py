"""FleetConfig: the replicas of a fleet (role, modelled GPU, tensor parallelism, KV pool), how requests are routed,
how KV moves in a disaggregated fleet, and the engine settings every replica runs with.

A replica is one engine instance on ``tp`` GPUs. Colocated replicas (role "mixed") prefill and decode, as one vLLM
or SGLang server does; a disaggregated fleet has a "prefill" pool and a "decode" pool (DistServe, Splitwise,
Mooncake). The KV pool of a replica is what is left of its GPUs' memory after the weights, at vLLM's default
``gpu_memory_utilization`` of 0.9 (activations and CUDA graphs, a few GB in vLLM, are not subtracted):
``(memory x tp x utilization - parameters x bytes per weight) / (block_size x KV bytes per token)`` blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minengine.core.policies import POLICIES
from minengine.core.scheduler_config import PREEMPTION_MODES
from minengine.fleet.kv_store import KVStoreConfig
from minengine.fleet.links import KVLink, get_link
from minengine.fleet.router_names import ROUTER_NAMES
from minengine.fleet.token_free import DEFAULT_MAX_POSITION_EMBEDDINGS
from minengine.timing.hardware import Hardware, get_hardware
from minengine.timing.model_shape import ModelShape, get_model_shape

ROLES = ("mixed", "prefill", "decode")
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default


def kv_pool_blocks(hardware: Hardware | str, shape: ModelShape | str, tp: int = 1, block_size: int = 16,
                   gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> int:
    """KV blocks that fit on ``tp`` GPUs of ``hardware`` next to the weights of ``shape``.

    With ``tp`` larger than the KV heads, heads are replicated (as the cost model does), so a token takes
    ``tp x ceil(kv_heads / tp) / kv_heads`` times its KV bytes over the replica.

    Raises:
        ValueError: the hardware has no ``memory_bytes``, or the weights do not fit (naming both sizes).
    """
    hw, m = get_hardware(hardware), get_model_shape(shape)
    if not hw.memory_bytes:
        raise ValueError(f"hardware {hw.name!r} has no memory_bytes: give the replica a num_kv_blocks")
    weights = m.num_params * m.dtype_bytes
    memory = hw.memory_bytes * tp * gpu_memory_utilization
    kv_heads_per_gpu = -(-m.num_kv_heads // tp)
    bytes_per_block = block_size * m.kv_bytes_per_token * tp * kv_heads_per_gpu / m.num_kv_heads
    blocks = int((memory - weights) // bytes_per_block)
    if blocks < 1:
        raise ValueError(f"{m.name} weights ({weights / 1e9:.1f} GB) do not fit in {tp} x {hw.name} at "
                         f"gpu_memory_utilization {gpu_memory_utilization} ({memory / 1e9:.1f} GB): raise tp")
    return blocks


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica: its role, its modelled GPU and tensor-parallel degree, and optionally its KV pool size.

    Attributes:
        role: "mixed" (colocated: prefills and decodes), "prefill" or "decode" (a disaggregated pool).
        hardware: a ``Hardware`` preset name or object ("h100", "a100", ...).
        tp: GPUs per replica (tensor parallelism).
        num_kv_blocks: KV pool in blocks; None = what the GPUs' memory holds (``kv_pool_blocks``).

    Raises:
        ValueError: an unknown role or hardware, ``tp`` or ``num_kv_blocks`` not a positive integer.
    """

    role: str = "mixed"
    hardware: str | Hardware = "h100"
    tp: int = 1
    num_kv_blocks: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"ReplicaSpec.role must be one of {ROLES}, got {self.role!r}")
        get_hardware(self.hardware)
        if not isinstance(self.tp, int) or isinstance(self.tp, bool) or self.tp < 1:
            raise ValueError(f"ReplicaSpec.tp must be a positive integer, got {self.tp!r}")
        if self.num_kv_blocks is not None and (not isinstance(self.num_kv_blocks, int)
                                               or isinstance(self.num_kv_blocks, bool) or self.num_kv_blocks < 1):
            raise ValueError(f"ReplicaSpec.num_kv_blocks must be a positive integer or None, "
                             f"got {self.num_kv_blocks!r}")


@dataclass(frozen=True)
class FleetConfig:
    """A fleet: its replicas, routers, KV link and the engine settings all replicas share.

    Build one with ``FleetConfig.colocated(n)`` or ``FleetConfig.disaggregated(p, d)`` (keywords: any field).

    Attributes:
        replicas: the replicas, in index order: all "mixed", or "prefill" and "decode" (at least one of each).
        model: the model shape every replica serves (preset name, config path or ``ModelShape``).
        router: how an arriving request picks a replica of the first stage ("mixed" or "prefill"): a name in
            ``minengine.fleet.ROUTERS`` ("round-robin", "random", "power-of-two", "least-outstanding-tokens",
            "least-kv-usage", "cache-aware", "prefix-aware", "conductor").
        decode_router: how a finished prefill picks a decode replica (disaggregated only).
        link: the KV link between prefill and decode replicas (a ``LINKS`` name or a ``KVLink``).
        kv_store: the fleet-level KV store (``KVStoreConfig``: Mooncake's store in the nodes' DRAM/SSD), or None:
            each replica has only its own prefix cache. Needs ``enable_prefix_caching``.
        max_num_batched_tokens, max_num_seqs, block_size, enable_chunked_prefill, long_prefill_token_threshold,
            enable_prefix_caching, scheduling_policy, preemption_mode: ``EngineConfig``'s fields, for every
            replica. Defaults are vLLM V1's for an online server: a 2,048-token budget, 256 sequences.
        max_model_len: the longest request (prompt + output tokens); longer trace requests are clipped.
        gpu_memory_utilization: the share of GPU memory for weights + KV cache, in (0, 1].
        seed: seeds the "random" router and the synthetic prompt ids of traces without token ids.
        timeline_interval_s: simulated seconds between two samples of each replica's KV use and queues (for
            the dashboard's lanes); 0 samples every step.
        keep_step_traces: keep every engine ``StepTrace`` (memory grows with the steps: small runs only).

    Raises:
        ValueError: naming the field, for anything out of range.
    """

    replicas: tuple[ReplicaSpec, ...] = (ReplicaSpec(),)
    model: str | ModelShape = "llama-3-8b"
    router: str = "round-robin"
    decode_router: str = "least-outstanding-tokens"
    link: str | KVLink = "ib-400g"
    kv_store: KVStoreConfig | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    block_size: int = 16
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    scheduling_policy: str = "decode-first"
    preemption_mode: str = "recompute"
    max_model_len: int = DEFAULT_MAX_POSITION_EMBEDDINGS
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    seed: int = 0
    timeline_interval_s: float = 1.0
    keep_step_traces: bool = False
    shape: ModelShape = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", tuple(self.replicas))
        object.__setattr__(self, "shape", get_model_shape(self.model))
        if not self.replicas or not all(isinstance(r, ReplicaSpec) for r in self.replicas):
            raise ValueError("replicas must be a non-empty sequence of ReplicaSpec")
        roles = {r.role for r in self.replicas}
        if "mixed" in roles and roles != {"mixed"}:
            raise ValueError("replicas must be all 'mixed' (colocated) or 'prefill' + 'decode' (disaggregated)")
        if "mixed" not in roles and roles != {"prefill", "decode"}:
            raise ValueError("a disaggregated fleet needs at least one 'prefill' and one 'decode' replica")
        for name in ("router", "decode_router"):
            if getattr(self, name) not in ROUTER_NAMES:
                raise ValueError(f"{name} must be one of {ROUTER_NAMES}, got {getattr(self, name)!r}")
        object.__setattr__(self, "link", get_link(self.link))
        if self.kv_store is not None:
            if not isinstance(self.kv_store, KVStoreConfig):
                raise ValueError(f"kv_store must be a KVStoreConfig or None, got {type(self.kv_store).__name__}")
            if not self.enable_prefix_caching:
                raise ValueError("kv_store needs enable_prefix_caching=True (loaded blocks enter the prefix cache)")
        for name in ("max_num_batched_tokens", "max_num_seqs", "block_size", "max_model_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.scheduling_policy not in POLICIES:
            raise ValueError(f"scheduling_policy must be one of {tuple(POLICIES)}, got {self.scheduling_policy!r}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or isinstance(u, bool) or not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {u!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        t = self.timeline_interval_s
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not t >= 0:
            raise ValueError(f"timeline_interval_s must be a number >= 0 (seconds), got {t!r}")

    # ---- the two kinds of fleet ---------------------------------------------------------------------------
    @classmethod
    def colocated(cls, num_replicas: int, hardware: str | Hardware = "h100", tp: int = 1, **fields) -> FleetConfig:
        """``num_replicas`` identical "mixed" replicas of ``tp`` GPUs each (``fields``: any other field)."""
        _check_count("num_replicas", num_replicas)
        return cls(replicas=(ReplicaSpec("mixed", hardware, tp),) * num_replicas, **fields)

    @classmethod
    def disaggregated(cls, num_prefill: int, num_decode: int, hardware: str | Hardware = "h100", tp: int = 1,
                      decode_hardware: str | Hardware | None = None, decode_tp: int | None = None,
                      **fields) -> FleetConfig:
        """A prefill pool of ``num_prefill`` and a decode pool of ``num_decode`` replicas; the decode pool may
        run other GPUs (Splitwise's heterogeneous H100 prefill / A100 decode fleet) or another ``tp``."""
        _check_count("num_prefill", num_prefill)
        _check_count("num_decode", num_decode)
        prefill = (ReplicaSpec("prefill", hardware, tp),) * num_prefill
        decode = (ReplicaSpec("decode", decode_hardware or hardware, decode_tp or tp),) * num_decode
        return cls(replicas=prefill + decode, **fields)

    # ---- derived ----------------------------------------------------------------------------------------
    @property
    def is_disaggregated(self) -> bool:
        return self.replicas[0].role != "mixed"

    @property
    def num_gpus(self) -> int:
        """GPUs of the whole fleet: the sum of the replicas' ``tp``."""
        return sum(r.tp for r in self.replicas)

    def num_kv_blocks(self, spec: ReplicaSpec) -> int:
        """The KV pool of one replica, in blocks (its ``num_kv_blocks`` or what its memory holds)."""
        if spec.num_kv_blocks is not None:
            return spec.num_kv_blocks
        return kv_pool_blocks(spec.hardware, self.shape, spec.tp, self.block_size, self.gpu_memory_utilization)

    def describe(self) -> str:
        """One line: "16 x H100 SXM (TP 1), colocated, Llama-3-8B shapes, router round-robin"."""
        def pool(specs: list[ReplicaSpec]) -> str:
            groups: dict[tuple, int] = {}
            for s in specs:
                key = (get_hardware(s.hardware).name, s.tp)
                groups[key] = groups.get(key, 0) + 1
            return " + ".join(f"{n} x {hw} (TP {tp})" for (hw, tp), n in groups.items())

        store = f", KV store {self.kv_store.describe()}" if self.kv_store is not None else ""
        if self.is_disaggregated:
            p = [s for s in self.replicas if s.role == "prefill"]
            d = [s for s in self.replicas if s.role == "decode"]
            return (f"prefill {pool(p)} / decode {pool(d)}, disaggregated over {self.link.name}, "
                    f"{self.shape.name} shapes, routers {self.router} / {self.decode_router}{store}")
        return f"{pool(list(self.replicas))}, colocated, {self.shape.name} shapes, router {self.router}{store}"


def _check_count(name: str, n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")

"""KV-cache links: how long moving a finished prefill's KV cache from a prefill replica to a decode replica takes.

Disaggregated serving (DistServe, Zhong et al., OSDI 2024; Splitwise, Patel et al., ISCA 2024; Mooncake, Qin et al.,
FAST 2025) runs prefill and decode on different GPUs, so every request's KV cache crosses a link once: ``prompt
tokens x KV bytes per token`` bytes (Llama-3-8B in BF16: 128 KiB per token, so a 1,000-token prompt is 131 MB).

A transfer takes ``latency + bytes / (bandwidth x efficiency x lanes)``, where ``lanes`` is the tensor-parallel
degree both sides share (each GPU sends its own KV heads over its own NIC, as on a DGX H100 with one 400 Gb/s NIC
per GPU). A replica sends one transfer at a time and receives one at a time (its NICs are busy while it does), so
transfers queue when prefills finish faster than the link drains them.

Presets (line rates per direction; ``efficiency`` 1.0 = the line rate, lower it for protocol overhead: Mooncake's
Transfer Engine reports ~87 % of 4 x 200 Gb/s):
- ``nvlink``: NVLink 4 between H100s in one node, 450 GB/s per direction (900 GB/s total; NVIDIA H100 datasheet).
- ``ib-400g``: 400 Gb/s InfiniBand NDR (50 GB/s), one NIC per GPU, across nodes (NVIDIA ConnectX-7).
- ``ethernet-100g``: 100 Gb/s Ethernet (12.5 GB/s), a commodity datacenter NIC.
- ``infinite``: no cost at all (for checking that a disaggregated fleet is its prefill timing plus its decode timing).
The latencies are the order of magnitude of one RDMA / NCCL send (microseconds): negligible next to the bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIGA = 1e9


@dataclass(frozen=True)
class KVLink:
    """A link between replicas. Units: bytes/s and seconds.

    Attributes:
        name: shown in tables ("400 Gb/s InfiniBand").
        bandwidth: bytes/s per direction per lane (``math.inf``: free transfers).
        latency_s: fixed seconds per transfer.
        efficiency: fraction of ``bandwidth`` a transfer reaches, in (0, 1].

    Raises:
        ValueError: a bandwidth that is not > 0, a negative latency, an efficiency outside (0, 1].
    """

    name: str
    bandwidth: float
    latency_s: float = 0.0
    efficiency: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.bandwidth, (int, float)) or isinstance(self.bandwidth, bool) or not self.bandwidth > 0:
            raise ValueError(f"KVLink.bandwidth must be a number > 0 (bytes/s), got {self.bandwidth!r}")
        if not isinstance(self.latency_s, (int, float)) or not self.latency_s >= 0 or math.isinf(self.latency_s):
            raise ValueError(f"KVLink.latency_s must be a finite number >= 0 (seconds), got {self.latency_s!r}")
        if not isinstance(self.efficiency, (int, float)) or not 0 < self.efficiency <= 1:
            raise ValueError(f"KVLink.efficiency must be in (0, 1], got {self.efficiency!r}")

    def transfer_time(self, num_bytes: float, lanes: int = 1) -> float:
        """Seconds to move ``num_bytes`` over ``lanes`` parallel lanes (0 for an infinite link)."""
        if math.isinf(self.bandwidth):
            return self.latency_s
        return self.latency_s + num_bytes / (self.bandwidth * self.efficiency * lanes)


LINKS: dict[str, KVLink] = {
    "nvlink": KVLink("NVLink 4 (450 GB/s)", 450 * GIGA, latency_s=5e-6),
    "ib-400g": KVLink("400 Gb/s InfiniBand", 50 * GIGA, latency_s=10e-6),
    "ethernet-100g": KVLink("100 Gb/s Ethernet", 12.5 * GIGA, latency_s=30e-6),
    "infinite": KVLink("infinite bandwidth", math.inf, latency_s=0.0),
}


def get_link(link: str | KVLink) -> KVLink:
    """A preset by name ("nvlink", "ib-400g", "ethernet-100g", "infinite") or a ``KVLink`` as is.

    Raises:
        ValueError: an unknown name (the message lists the presets).
    """
    if isinstance(link, KVLink):
        return link
    if not isinstance(link, str) or link.strip().lower() not in LINKS:
        raise ValueError(f"unknown KV link {link!r}; presets: {', '.join(LINKS)}")
    return LINKS[link.strip().lower()]

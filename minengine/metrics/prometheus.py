"""Prometheus metrics with vLLM's series names, types, labels and buckets, so a vLLM Grafana dashboard works.

vLLM's names come from its v1 ``PrometheusStatLogger`` (``vllm/v1/metrics/loggers.py``); every series has the labels
``model_name`` and ``engine`` (always "0" here: one engine). minengine's own series (swap, timeouts, free blocks,
step time, ``minengine:prompt_tokens_recomputed``) are under ``minengine:``. Each engine has its own
``CollectorRegistry`` (no global state, many engines per process);
``prometheus_client.generate_latest(logger.registry)`` renders it.

The 36 series vLLM registers whatever the configuration (0.33's, and ``vllm:prompt_tokens_cached_by_source``) are
all here (with a ``speculative_config`` the four ``vllm:spec_decode_*`` counters too). Five of them count things
minengine does not have and stay at their constant value: ``vllm:external_prefix_cache_*`` (a KV connector's
cross-instance cache), ``vllm:mm_cache_*`` (multimodal inputs), ``vllm:admission_rejections`` (a bounded API queue),
and ``vllm:engine_sleep_state`` is always ``awake``; so do the tiers of ``vllm:prompt_tokens_cached_by_source``
other than ``device`` (no CPU, disk or KV-connector cache). ``vllm:iteration_tokens_total`` observes the tokens a
step computed (prefill chunks + decodes), as vLLM 0.33 does. One difference, on purpose:
``vllm:request_time_per_output_token_seconds`` is observed only for requests with at least two tokens.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from minengine.metrics.trace import StepTrace
from minengine.outputs import RequestMetrics
from minengine.request import Request

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
N_BUCKETS = [1, 2, 5, 10, 20]
PREEMPTION_BUCKETS = [1, 2, 3, 4, 5, 10, 20]  # vLLM's vllm:request_num_preemptions
WAITING_REASONS = ("capacity", "deferred")  # vLLM's vllm:num_requests_waiting_by_reason
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")  # vllm:prompt_tokens_by_source
# vllm:prompt_tokens_cached_by_source: where cached prompt tokens were held. minengine's prefix cache is the KV pool
# itself ("device"); it has no CPU, disk or external (KV connector) tier, so those stay at 0, as in vLLM without one.
CACHE_SOURCES = ("device", "cpu", "disk", "mixed", "external")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")  # vllm:engine_sleep_state
ADMISSION_REJECT_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")  # vllm:admission_rejections
STEP_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
FINISH_REASONS = ("stop", "length", "abort", "timeout")


def _locked(method):
    """Run ``method`` holding the logger's lock, so a scrape (``render``) never sees half of one update."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)
    return wrapper


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's buckets for token counts)."""
    buckets, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return buckets
            buckets.append(m * scale)
        scale *= 10


class PrometheusStatLogger:
    """The engine's Prometheus series, updated once per step (and on aborts).

    Args:
        model_name: the ``model_name`` label (the served model name).
        max_model_len: top of the token-count buckets (tokens).
        cache_info: labels of ``vllm:cache_config_info`` (block_size, num_gpu_blocks, ...).
        num_speculative_tokens: k of speculative decoding; when > 0 the four ``vllm:spec_decode_*`` counters
            exist (as in vLLM, only with a ``speculative_config``), ``..._num_accepted_tokens_per_pos`` with a
            ``position`` label 0..k-1.

    Attributes:
        registry: the ``CollectorRegistry`` holding every series.
        lock: held by every ``record_*`` call and by ``render``. The server's engine loop records from its own
            thread while ``/metrics`` renders in another; without it a scrape between two ``set`` calls could
            read ``vllm:kv_cache_usage_perc`` of this step beside ``minengine:num_free_blocks`` of the last one.
    """

    def __init__(self, model_name: str, max_model_len: int, cache_info: dict[str, str] | None = None,
                 num_speculative_tokens: int = 0):
        self.registry = CollectorRegistry()
        self.lock = threading.RLock()
        names, values = ["model_name", "engine"], [model_name, "0"]
        reg = self.registry

        def gauge(name, doc):
            return Gauge(name, doc, names, registry=reg).labels(*values)

        def counter(name, doc):
            return Counter(name, doc, names, registry=reg).labels(*values)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, names, buckets=buckets, registry=reg).labels(*values)

        def labelled(kind, name, doc, label, label_values, **kwargs):
            family = kind(name, doc, names + [label], registry=reg, **kwargs)
            return {v: family.labels(*values, v) for v in label_values}

        token_buckets = build_1_2_5_buckets(max_model_len)
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.waiting_by_reason = labelled(Gauge, "vllm:num_requests_waiting_by_reason",
                                          "Number of requests waiting, by reason.", "reason", WAITING_REASONS)
        self.sleep_state = labelled(Gauge, "vllm:engine_sleep_state", "Engine sleep state; awake = 1 means the "
                                    "engine is awake (minengine has no sleep mode).", "sleep_state", SLEEP_STATES)
        self.sleep_state["awake"].set(1)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        # a KV connector's cross-instance cache and the multimodal cache: features minengine has not, so 0
        self.external_prefix_queries = counter("vllm:external_prefix_cache_queries",
                                               "External prefix cache queries (KV connector), in queried tokens.")
        self.external_prefix_hits = counter("vllm:external_prefix_cache_hits",
                                            "External prefix cache hits (KV connector), in cached tokens.")
        self.mm_cache_queries = counter("vllm:mm_cache_queries", "Multi-modal cache queries, in queried items.")
        self.mm_cache_hits = counter("vllm:mm_cache_hits", "Multi-modal cache hits, in cached items.")
        self.admission_rejections = labelled(Counter, "vllm:admission_rejections",
                                             "Number of admission attempts rejected (queue full).", "reason",
                                             ADMISSION_REJECT_REASONS)
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_tokens_by_source = labelled(Counter, "vllm:prompt_tokens_by_source",
                                                "Number of prompt tokens by source.", "source", PROMPT_SOURCES)
        self.prompt_tokens_cached = counter("vllm:prompt_tokens_cached",
                                            "Number of cached prompt tokens (local + external).")
        self.prompt_tokens_cached_by_source = labelled(Counter, "vllm:prompt_tokens_cached_by_source",
                                                       "Number of cached prompt tokens, by the cache tier that held "
                                                       "them.", "source", CACHE_SOURCES)
        # not a vLLM series: the prompt's last token, cached and computed again for its logits (vLLM counts it
        # in prompt_tokens_by_source's local_cache_hit without a series of its own)
        self.prompt_tokens_recomputed = counter("minengine:prompt_tokens_recomputed",
                                                "Number of cached tokens recomputed for forward pass.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          names + ["finished_reason"], registry=reg)
        self.success = {r: success.labels(*values, r) for r in FINISH_REASONS}
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               token_buckets)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.", token_buckets)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.", ITERATION_TOKEN_BUCKETS)
        self.max_num_generation_tokens = histogram("vllm:request_max_num_generation_tokens",
                                                   "Histogram of maximum number of requested generation tokens.",
                                                   token_buckets)
        self.params_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.params_max_tokens = histogram("vllm:request_params_max_tokens",
                                           "Histogram of the max_tokens request parameter.", token_buckets)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.inference = histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill_kv_computed = histogram("vllm:request_prefill_kv_computed_tokens",
                                             "Histogram of new KV tokens computed during prefill (excluding cached "
                                             "tokens).", token_buckets)
        self.request_preemptions = histogram("vllm:request_num_preemptions",
                                             "Histogram of the number of preemptions per finished request.",
                                             PREEMPTION_BUCKETS)
        # n > 1: child request id -> its group [unfinished child ids, the largest output so far] (vLLM observes
        # vllm:request_max_num_generation_tokens once per parent, when its last child finishes)
        self._groups: dict[str, list] = {}
        if cache_info:
            info = {"engine": "0", **cache_info}
            Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info),
                  registry=reg).labels(**info).set(1)
        self.spec_drafts = self.spec_draft_tokens = self.spec_accepted_tokens = None
        self.spec_accepted_per_pos: list = []
        if num_speculative_tokens > 0:  # vLLM's SpecDecodingProm
            self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
            self.spec_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                              names + ["position"], registry=reg)
            self.spec_accepted_per_pos = [per_pos.labels(*values, str(i)) for i in range(num_speculative_tokens)]
        # minengine's own
        self.swapped = gauge("minengine:num_requests_swapped", "Requests whose KV blocks are in the CPU swap space.")
        self.free_blocks = gauge("minengine:num_free_blocks", "KV blocks no request holds (cached ones included).")
        self.cached_free_blocks = gauge("minengine:num_cached_free_blocks",
                                        "Free KV blocks that still hold a cached prefix.")
        self.swapped_out = counter("minengine:swapped_out_blocks", "KV blocks copied to the CPU swap space.")
        self.swapped_in = counter("minengine:swapped_in_blocks", "KV blocks copied back from the CPU swap space.")
        self.swap_time = counter("minengine:swap_time_seconds", "Seconds spent copying KV blocks to and from swap.")
        self.timeouts = counter("minengine:num_timeouts", "Requests finished because their deadline passed.")
        self.steps = counter("minengine:num_steps", "Engine steps that computed tokens.")
        self.prefill_tokens = counter("minengine:prefill_tokens", "Prompt (and recompute) tokens computed.")
        self.decode_tokens = counter("minengine:decode_tokens", "Decode tokens computed.")
        self.step_time = histogram("minengine:step_duration_seconds", "Engine step duration in seconds (engine clock).",
                                   STEP_BUCKETS)

    def render(self) -> bytes:
        """The Prometheus text exposition of every series, as one consistent snapshot (between two updates)."""
        with self.lock:
            return generate_latest(self.registry)

    @_locked
    def record_new_request(self, n: int, child_ids: Iterable[str] = ()) -> None:
        """A request was accepted, with ``n`` sequences (``child_ids``: its engine requests when ``n > 1``)."""
        self.params_n.observe(n)
        child_ids = list(child_ids)
        if len(child_ids) > 1:
            group = [set(child_ids), 0]
            for rid in child_ids:
                self._groups[rid] = group

    @_locked
    def record_state(self, num_running: int, num_waiting: int, num_swapped: int, num_free_blocks: int,
                     num_cached_free_blocks: int, num_kv_blocks: int, num_deferred: int = 0) -> None:
        """The scheduler's queues and the KV pool now. ``num_deferred`` of the ``num_waiting`` requests wait for
        something other than capacity (vLLM's "deferred": a transient constraint; minengine has none, so 0)."""
        self.running.set(num_running)
        self.waiting.set(num_waiting)
        self.waiting_by_reason["capacity"].set(num_waiting - num_deferred)
        self.waiting_by_reason["deferred"].set(num_deferred)
        self.swapped.set(num_swapped)
        self.kv_usage.set(1.0 - num_free_blocks / num_kv_blocks)
        self.free_blocks.set(num_free_blocks)
        self.cached_free_blocks.set(num_cached_free_blocks)
        self.last_cached_free_blocks = num_cached_free_blocks

    @_locked
    def record_step(self, trace: StepTrace | None, got_token: Iterable[Request],
                    metrics: dict[str, RequestMetrics], num_new_tokens: dict[str, int] | None = None) -> None:
        """One step: its trace (None when nothing was scheduled; a rolled-back step counts only its preemptions),
        the requests that got tokens and how many
        each got (``num_new_tokens``; 1 when absent). The inter-token latency is observed once per request per
        step, as vLLM does, also when speculative decoding brought several tokens at once."""
        num_generated = 0
        for request in got_token:
            m = metrics[request.request_id]
            n = num_new_tokens.get(request.request_id, 1) if num_new_tokens else 1
            if request.num_output_tokens == n:  # its first token: the prompt is done
                self.prompt_tokens.inc(request.num_prompt_tokens)
                self._record_prompt_sources(request.num_prompt_tokens, request.num_cached_tokens)
                self.ttft.observe(m.ttft)
            elif len(m.itls) >= n:
                self.itl.observe(m.itls[-n])  # the gap before this step's first token
            num_generated += n
        self.generation_tokens.inc(num_generated)  # once per step: each ``inc`` takes the series' lock
        if trace is None:
            return
        if trace.rolled_back:  # nothing ran: only its preemptions stand
            self.preemptions.inc(len(trace.preempted_ids))
            return
        if self.spec_drafts is not None:
            for c in trace.chunks:
                if c.num_spec_tokens:
                    self.spec_drafts.inc()
                    self.spec_draft_tokens.inc(c.num_spec_tokens)
                    self.spec_accepted_tokens.inc(c.num_accepted_tokens)
                    for pos in range(min(c.num_accepted_tokens, len(self.spec_accepted_per_pos))):
                        self.spec_accepted_per_pos[pos].inc()
        self.steps.inc()
        self.iteration_tokens.observe(trace.num_scheduled_tokens)
        self.prefill_tokens.inc(trace.num_prefill_tokens)
        self.decode_tokens.inc(trace.num_decode_tokens)
        self.step_time.observe(trace.duration)
        self.prefix_queries.inc(trace.prefix_queried_tokens)
        self.prefix_hits.inc(trace.prefix_hit_tokens)
        self.preemptions.inc(len(trace.preempted_ids))
        self.swapped_out.inc(trace.num_swapped_out_blocks)
        self.swapped_in.inc(trace.num_swapped_in_blocks)
        self.swap_time.inc(trace.swap_time_s)

    def _record_prompt_sources(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        """Where a finished prefill's prompt tokens came from (vLLM's ``PromptTokenStats``): computed here, or
        served by the prefix cache. A prompt cached up to its last token counts that token as cached and
        recomputed (it is computed again, for the logits to sample from)."""
        recomputed = 1 if num_cached_tokens + 1 == num_prompt_tokens else 0
        hit = num_cached_tokens + recomputed
        self.prompt_tokens_by_source["local_compute"].inc(num_prompt_tokens - hit)
        self.prompt_tokens_by_source["local_cache_hit"].inc(hit)
        self.prompt_tokens_cached.inc(num_cached_tokens)
        self.prompt_tokens_cached_by_source["device"].inc(num_cached_tokens)  # the KV pool: minengine's one tier
        self.prompt_tokens_recomputed.inc(recomputed)

    def _record_max_generation_tokens(self, request_id: str | None, num_output_tokens: int) -> None:
        group = self._groups.pop(request_id, None) if request_id is not None else None
        if group is None:
            self.max_num_generation_tokens.observe(num_output_tokens)
            return
        group[0].discard(request_id)
        group[1] = max(group[1], num_output_tokens)
        if not group[0]:  # the parent's last child
            self.max_num_generation_tokens.observe(group[1])

    @_locked
    def record_finished(self, finished: Iterable[tuple]) -> None:
        """Requests that finished (any reason): (their metrics, their ``max_tokens``[, their request id: children
        of an ``n > 1`` request are gathered by it])."""
        for m, max_tokens, *rid in finished:
            self._record_max_generation_tokens(rid[0] if rid else None, m.num_output_tokens)
            self.request_preemptions.observe(m.num_preemptions)
            self.prefill_kv_computed.observe(m.num_prompt_tokens - m.num_cached_tokens)
            reason = m.finish_reason or "abort"
            self.success.setdefault(reason, self.success["abort"]).inc()
            if reason == "timeout":
                self.timeouts.inc()
            if m.e2e_latency is not None:
                self.e2e.observe(m.e2e_latency)
            self.request_prompt_tokens.observe(m.num_prompt_tokens)
            self.request_generation_tokens.observe(m.num_output_tokens)
            if max_tokens is not None:
                self.params_max_tokens.observe(max_tokens)
            if m.first_scheduled_time is None:
                continue  # never ran: no queue/prefill/decode phases
            self.queue.observe(m.first_scheduled_time - m.arrival_time)
            self.inference.observe(m.finished_time - m.first_scheduled_time)
            if m.first_token_time is not None:
                self.prefill.observe(m.first_token_time - m.first_scheduled_time)
                self.decode.observe(m.finished_time - m.first_token_time)
            if m.tpot is not None:
                self.tpot.observe(m.tpot)

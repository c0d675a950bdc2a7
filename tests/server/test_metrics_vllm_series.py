"""The vLLM 0.33 series of /metrics beyond the core request counters: each moves when it should (and the ones
for features minengine has not stay where vLLM leaves them without those features)."""

from __future__ import annotations

import pytest

from minengine import LLMEngine, SamplingParams
from minengine.metrics.prometheus import CACHE_SOURCES, PREEMPTION_BUCKETS, build_1_2_5_buckets
from tests.conftest import drain


def _v(engine: LLMEngine, name: str, **labels) -> float:
    value = engine.stat_logger.registry.get_sample_value(name, {"model_name": engine.config.served_model_name,
                                                                "engine": "0", **labels})
    assert value is not None, (name, labels)
    return value


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def test_waiting_by_reason_follows_the_waiting_queue(bundled_model):
    engine = LLMEngine.from_config(model=bundled_model, max_num_seqs=1, max_model_len=256)
    for i in range(3):
        engine.add_request(str(i), {"prompt_token_ids": [5 + i] * 8}, _greedy(2))
    assert _v(engine, "vllm:num_requests_waiting_by_reason", reason="capacity") == 3
    engine.step()  # one slot: one request runs, two wait for capacity
    assert _v(engine, "vllm:num_requests_waiting_by_reason", reason="capacity") == 2 == \
        _v(engine, "vllm:num_requests_waiting")
    assert _v(engine, "vllm:num_requests_waiting_by_reason", reason="deferred") == 0
    drain(engine)
    assert _v(engine, "vllm:num_requests_waiting_by_reason", reason="capacity") == 0


def test_request_num_preemptions_counts_each_finished_requests_preemptions(bundled_model):
    # a pool too small for all four: the scheduler preempts by recompute
    engine = LLMEngine.from_config(model=bundled_model, num_kv_blocks=8, block_size=16, max_model_len=128,
                                   enable_prefix_caching=False)
    for i in range(4):
        engine.add_request(str(i), {"prompt_token_ids": [7 + i] * 20}, _greedy(40))
    drain(engine)
    per_request = [m.num_preemptions for m in engine.request_metrics.values()]
    assert sum(per_request) > 0
    assert _v(engine, "vllm:request_num_preemptions_sum") == sum(per_request) == \
        _v(engine, "vllm:num_preemptions_total")
    assert _v(engine, "vllm:request_num_preemptions_count") == 4
    for le in PREEMPTION_BUCKETS:
        assert _v(engine, "vllm:request_num_preemptions_bucket", le=str(float(le))) == \
            sum(p <= le for p in per_request)


@pytest.mark.parametrize("prompt_len, cached, recomputed", [(33, 32, 1), (40, 32, 0)])
def test_prompt_token_sources_cached_and_recomputed(bundled_model, prompt_len, cached, recomputed):
    """Block size 16: a repeat of a 33-token prompt is cached up to its last token (32 cached, the last one
    recomputed, as vLLM counts it); of a 40-token prompt the two full blocks (32) are cached."""
    engine = LLMEngine.from_config(model=bundled_model, block_size=16, max_model_len=256)
    prompt = {"prompt_token_ids": [(11 * j) % 90 + 3 for j in range(prompt_len)]}
    engine.add_request("first", prompt, _greedy(2))
    drain(engine)
    assert _v(engine, "vllm:prompt_tokens_cached_total") == 0
    for source in CACHE_SOURCES:  # always exported, from the start
        assert _v(engine, "vllm:prompt_tokens_cached_by_source_total", source=source) == 0
    assert _v(engine, "vllm:prompt_tokens_by_source_total", source="local_compute") == prompt_len
    engine.add_request("again", prompt, _greedy(2))
    drain(engine)
    assert engine.request_metrics["again"].num_cached_tokens == cached
    assert _v(engine, "vllm:prompt_tokens_cached_total") == cached
    assert _v(engine, "minengine:prompt_tokens_recomputed_total") == recomputed
    assert engine.stat_logger.registry.get_sample_value("vllm:prompt_tokens_recomputed_total",
                                                        {"model_name": engine.config.served_model_name,
                                                         "engine": "0"}) is None  # not a vLLM series
    # every cached token was held by the KV pool ("device"), the one tier minengine has
    assert _v(engine, "vllm:prompt_tokens_cached_by_source_total", source="device") == cached
    assert sum(_v(engine, "vllm:prompt_tokens_cached_by_source_total", source=s) for s in CACHE_SOURCES) == \
        _v(engine, "vllm:prompt_tokens_cached_total")
    assert _v(engine, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == cached + recomputed
    assert _v(engine, "vllm:prompt_tokens_by_source_total", source="local_compute") == \
        2 * prompt_len - cached - recomputed
    assert _v(engine, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    by_source = sum(_v(engine, "vllm:prompt_tokens_by_source_total", source=s)
                    for s in ("local_compute", "local_cache_hit", "external_kv_transfer"))
    assert by_source == _v(engine, "vllm:prompt_tokens_total") == 2 * prompt_len
    # the prefill's new KV, per request: the prompt minus its cached tokens
    assert _v(engine, "vllm:request_prefill_kv_computed_tokens_sum") == 2 * prompt_len - cached
    assert _v(engine, "vllm:request_prefill_kv_computed_tokens_count") == 2


def test_max_num_generation_tokens_is_one_observation_per_parent(bundled_model):
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=256)
    # sampled children that stop at different lengths on a common token; one plain request beside them
    engine.add_request("p", "ROMEO:", SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=24,
                                                     stop_token_ids=list(range(0, 60))))
    engine.add_request("single", {"prompt_token_ids": [9] * 6}, _greedy(5))
    drain(engine)
    children = [engine.request_metrics[f"{i}_p"].num_output_tokens for i in range(3)]
    assert _v(engine, "vllm:request_max_num_generation_tokens_count") == 2  # the parent once, the single once
    assert _v(engine, "vllm:request_max_num_generation_tokens_sum") == max(children) + 5
    buckets = [float(s.labels["le"]) for f in engine.stat_logger.registry.collect()
               if f.name == "vllm:request_max_num_generation_tokens" for s in f.samples if s.name.endswith("_bucket")]
    assert buckets == [float(b) for b in build_1_2_5_buckets(256)] + [float("inf")]


def test_series_of_features_minengine_lacks_stay_at_vllms_idle_values(bundled_model):
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=256)
    prompt = {"prompt_token_ids": [4] * 40}
    for i in range(3):
        engine.add_request(str(i), prompt, _greedy(4))
    drain(engine)
    assert _v(engine, "vllm:prefix_cache_hits_total") > 0  # the local prefix cache moved...
    for name in ("vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total",
                 "vllm:mm_cache_queries_total", "vllm:mm_cache_hits_total"):
        assert _v(engine, name) == 0  # ...a KV connector's and the multimodal cache did not (there are none)
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        assert _v(engine, "vllm:admission_rejections_total", reason=reason) == 0  # no bounded queue
    assert _v(engine, "vllm:engine_sleep_state", sleep_state="awake") == 1
    assert _v(engine, "vllm:engine_sleep_state", sleep_state="weights_offloaded") == 0
    assert _v(engine, "vllm:engine_sleep_state", sleep_state="discard_all") == 0


def test_a_scrape_never_sees_half_of_a_state_update():
    """The server's engine loop records from its own thread while /metrics renders in another: ``render`` and every
    ``record_*`` hold one lock, so KV usage and free blocks of a scrape always come from the same update (chapter
    9's exercise compares them and once read a torn pair)."""
    import threading
    import time

    from prometheus_client.parser import text_string_to_metric_families

    from minengine.metrics.prometheus import PrometheusStatLogger

    logger = PrometheusStatLogger("m", 64)
    total = 64

    def free_and_usage() -> tuple[float, float]:
        values = {s.name: s.value for f in text_string_to_metric_families(logger.render().decode()) for s in f.samples}
        return values["minengine:num_free_blocks"], values["vllm:kv_cache_usage_perc"]

    # while a render holds the lock, an update waits for it
    logger.record_state(0, 0, 0, 10, 0, total)
    with logger.lock:
        writer = threading.Thread(target=logger.record_state, args=(0, 0, 0, 20, 0, total))
        writer.start()
        writer.join(timeout=0.2)
        assert writer.is_alive() and logger.free_blocks._value.get() == 10
    writer.join(timeout=5)
    assert free_and_usage() == (20, 1 - 20 / total)

    # and under a writer hammering updates, every scrape is one update's pair
    stop = threading.Event()

    def hammer():
        i = 0
        while not stop.is_set():
            logger.record_state(0, 0, 0, i % (total + 1), 0, total)
            i += 1
            time.sleep(0)  # let the scraper in

    writer = threading.Thread(target=hammer)
    writer.start()
    try:
        for _ in range(50):
            free, usage = free_and_usage()
            assert usage == 1.0 - free / total, (free, usage)
    finally:
        stop.set()
        writer.join(timeout=5)

"""The simulator's routers that implement vllm-router's rules: ``power-of-two`` (``src/policies/power_of_two.rs``) and
``cache-aware`` (``src/policies/cache_aware.rs``), each rule on stand-in replicas whose load the test sets."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine.fleet.request import FleetRequest
from minengine.fleet.routers import CacheAware, PowerOfTwo, PrefixAware, make_router


@dataclass
class View:
    """A replica as a router sees it: its index, load, and (for prefix-aware) a cached prefix in tokens."""

    index: int
    outstanding_requests: int = 0
    cached: int = 0

    def cached_prefix_tokens(self, request) -> int:
        return self.cached


def request(tokens: list[int], i: int = 0) -> FleetRequest:
    return FleetRequest(i, f"r{i}", 0.0, len(tokens), 1, tokens, 2048, 16)


@settings(max_examples=60, deadline=None)
@given(loads=st.lists(st.integers(0, 5), min_size=2, max_size=5), seed=st.integers(0, 10**6))
def test_power_of_two_never_picks_the_one_most_loaded_replica(loads, seed):
    views = [View(i, n) for i, n in enumerate(loads)]
    router = PowerOfTwo(seed)
    for _ in range(20):
        chosen = router.select(None, views)
        assert chosen.outstanding_requests < max(loads) or loads.count(max(loads)) > 1


def test_power_of_two_with_two_replicas_takes_the_less_loaded_and_draws_at_equal_load():
    busy, idle = View(0, 3), View(1, 1)
    router = PowerOfTwo(0)
    assert {router.select(None, [busy, idle]).index for _ in range(50)} == {1}
    picks = [router.select(None, [View(0), View(1)]).index for _ in range(400)]
    assert 150 < picks.count(0) < 250  # equal loads: the first of two random draws, so each half the time
    assert [PowerOfTwo(7).select(None, [View(0), View(1)]).index for _ in range(5)] == \
        [PowerOfTwo(7).select(None, [View(0), View(1)]).index for _ in range(5)]  # seeded
    assert PowerOfTwo(0).select(None, [busy]) is busy


def test_cache_aware_sends_a_resent_prefix_where_it_went_before():
    router = CacheAware()
    a, b = View(0), View(1)
    history = list(range(100, 164))  # 4 blocks
    first = router.select(request(history + [1, 2, 3]), [a, b])
    assert first is a and router.num_by_load == 1  # nothing recorded: the least loaded, the first on a tie
    a.outstanding_requests = 1  # still running: the least loaded is now b
    again = router.select(request(history + list(range(200, 216)), 1), [a, b])
    assert again is a and router.num_by_cache == 1  # 64 of 80 tokens recorded on a > 30 %
    other = router.select(request(list(range(300, 364)), 2), [a, b])
    assert other is b and router.num_by_load == 2  # no recorded prefix: the least loaded


def test_cache_aware_threshold_is_strict_and_counts_whole_blocks():
    router = CacheAware(cache_threshold=0.5)
    a, b = View(0), View(1, outstanding_requests=0)
    router.select(request(list(range(32))), [a, b])  # recorded under a
    a.outstanding_requests = 1
    half = request(list(range(32)) + list(range(500, 532)), 1)  # 32 of 64 tokens: exactly the threshold
    assert router.select(half, [a, b]) is b  # not more than 50 %: the least loaded
    b.outstanding_requests = 2  # the least loaded is a now; the shared 32 tokens were last sent to b
    assert router.select(request(list(range(40)) + [9], 2), [a, b]) is b  # 32 of 41 tokens: by cache


def test_cache_aware_imbalanced_load_goes_to_the_least_loaded_and_is_still_recorded():
    router = CacheAware(balance_abs_threshold=2, balance_rel_threshold=1.5)
    a, b = View(0), View(1)
    prompt = list(range(64))
    router.select(request(prompt), [a, b])  # recorded under a
    a.outstanding_requests, b.outstanding_requests = 6, 3  # gap 3 > 2 and 6 > 1.5 x 3: imbalanced
    assert router.is_imbalanced([6, 3]) and not router.is_imbalanced([6, 4]) and not router.is_imbalanced([5, 3])
    assert router.select(request(prompt + [1], 1), [a, b]) is b  # by load, despite a's prefix
    b.outstanding_requests = 6  # balanced again: the prompt was last sent to b
    assert router.select(request(prompt + [2], 2), [a, b]) is b


@settings(max_examples=40, deadline=None)
@given(loads=st.lists(st.integers(0, 200), min_size=2, max_size=4), held=st.integers(0, 3),
       shared=st.integers(0, 6))
def test_cache_aware_follows_vllm_router_rule(loads, held, shared):
    """The rule as vllm-router states it: imbalanced -> least loaded; else the recorded holder if its prefix is
    > 30 % of the prompt; else least loaded (ties: the first)."""
    views = [View(i, n) for i, n in enumerate(loads)]
    held %= len(views)
    router = CacheAware()
    router.record(request(list(range(96))), views[held])  # 6 blocks recorded under `held`
    prompt = list(range(shared * 16)) + list(range(1000, 1000 + (6 - shared) * 16 + 1))
    chosen = router.select(request(prompt, 1), views)
    least = loads.index(min(loads))
    imbalanced = max(loads) - min(loads) > 64 and max(loads) > 1.5 * min(loads)
    expected = least if imbalanced or not shared * 16 > 0.3 * len(prompt) else held
    assert chosen.index == expected


def test_prefix_aware_reads_the_caches_not_what_was_sent():
    router = make_router("prefix-aware")
    assert isinstance(router, PrefixAware) and isinstance(router, CacheAware)
    a, b = View(0, cached=0), View(1, 1, cached=48)
    assert router.select(request(list(range(80))), [a, b]) is b  # b's cache holds 48 of 80 tokens
    b.cached = 0  # evicted: nothing counts, whatever was sent where
    assert router.select(request(list(range(80)), 1), [a, b]) is a


def test_router_arguments_are_checked():
    with pytest.raises(ValueError, match="cache_threshold must be in"):
        CacheAware(cache_threshold=1.0)
    with pytest.raises(ValueError, match="balance_abs_threshold must be >= 0"):
        CacheAware(balance_rel_threshold=0.5)

"""``timing/expert_parallel.py``: the bytes a MoE layer's dispatch, combine and gather move over N ranks."""

from __future__ import annotations

import pytest

from minengine.timing.expert_parallel import expected_all_to_all_bytes, traffic_of_routing, traffic_of_step


def test_a_hand_counted_routing():
    """2 ranks, 4 experts (rank 0 holds 0-1, rank 1 holds 2-3), H = 8, 4-byte activations, 3 tokens."""
    loads = [[2, 1, 1, 0],   # rank 0's 2 tokens x top-2: 1 pair leaves (expert 2)
             [0, 1, 0, 1]]   # rank 1's token: 1 pair leaves (expert 1)
    t0, t1 = traffic_of_routing(loads, num_tokens=3, hidden_size=8, dtype_bytes=4)
    counts = 1 * 2 * 8  # one other rank, 2 experts' int64 counts
    assert (t0.dispatch_bytes, t0.combine_bytes) == (1 * 32 + counts, 1 * 32)
    assert (t1.dispatch_bytes, t1.combine_bytes) == (1 * 32 + counts, 1 * 32)
    assert t0.gather_bytes == t1.gather_bytes == 2 * 2 * 32  # 2 ranks x ceil(3 / 2) rows
    assert t0.all_to_all_bytes == 2 * 32 + counts


@pytest.mark.parametrize("ranks", [2, 4])
def test_routing_spread_evenly_moves_the_expected_fraction(ranks):
    """Every rank sends the same number of pairs to every expert: (N - 1) / N of the T k rows leave their rank
    in each direction, ``expected_all_to_all_bytes``; the counts are the rest of the dispatch."""
    experts, per_expert, hidden, top_k = 8, 3, 16, 2
    loads = [[per_expert] * experts for _ in range(ranks)]
    tokens = ranks * experts * per_expert // top_k
    traffic = traffic_of_routing(loads, tokens, hidden, 2)
    counts = ranks * (ranks - 1) * (experts // ranks) * 8
    expected = expected_all_to_all_bytes(tokens, top_k, hidden, 2, ranks)
    assert sum(t.dispatch_bytes for t in traffic) == expected + counts
    assert sum(t.combine_bytes for t in traffic) == expected
    assert expected_all_to_all_bytes(tokens, top_k, hidden, 2, 1) == 0


def test_an_unbalanced_routing_moves_more_than_the_even_count():
    """Each rank's pairs all go to the other rank's experts: every row travels, twice the even split's (N = 2)."""
    loads = [[0, 0, 4, 4], [4, 4, 0, 0]]
    traffic = traffic_of_routing(loads, num_tokens=8, hidden_size=4, dtype_bytes=4)
    payload = sum(t.combine_bytes for t in traffic)
    assert payload == 16 * 16 == 2 * expected_all_to_all_bytes(8, 2, 4, 4, 2)


def test_malformed_loads_are_value_errors():
    with pytest.raises(ValueError, match="E divisible by N"):
        traffic_of_routing([[1, 2, 3], [1, 2, 3]], 3, 4, 4)
    with pytest.raises(ValueError, match="N rows of E counts"):
        traffic_of_routing([[1, 2], [1, 2, 3, 4]], 3, 4, 4)


def test_a_step_sums_its_layers_per_rank():
    layer_a = [[2, 1, 1, 0], [0, 1, 0, 1]]
    layer_b = [[0, 0, 4, 4], [4, 4, 0, 0]]
    a, b = traffic_of_routing(layer_a, 3, 8, 4), traffic_of_routing(layer_b, 3, 8, 4)
    step = traffic_of_step([[layer_a[r], layer_b[r]] for r in range(2)], 3, 8, 4)
    for r in range(2):
        assert step[r].dispatch_bytes == a[r].dispatch_bytes + b[r].dispatch_bytes
        assert step[r].combine_bytes == a[r].combine_bytes + b[r].combine_bytes
        assert step[r].gather_bytes == a[r].gather_bytes + b[r].gather_bytes
    with pytest.raises(ValueError, match="same MoE layers"):
        traffic_of_step([[layer_a[0]], [layer_a[1], layer_b[1]]], 3, 8, 4)

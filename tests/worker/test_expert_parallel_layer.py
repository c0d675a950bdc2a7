"""``layers/expert_parallel.py`` on its own: an ``ExpertParallelMoeBlock`` over 2 forked gloo ranks equals the
one-process ``SparseMoeBlock`` with the same weights, and each rank's all-to-all bytes equal
``timing.expert_parallel.traffic_of_routing`` of its routing; for 1 token (one rank routes nothing), 7 tokens
(an odd split) and a router that sends every token to the second rank's experts."""

from __future__ import annotations

import multiprocessing
import traceback

import pytest
import torch

from minengine.distributed import TensorParallelGroup
from minengine.layers.expert_parallel import ExpertParallelMoeBlock, LocalExperts
from minengine.layers.moe import SparseMoeBlock
from minengine.timing.expert_parallel import traffic_of_routing

H, INTER, E, K = 16, 24, 4, 2  # hidden, expert intermediate, experts, top-k


def make_block(skew: bool) -> SparseMoeBlock:
    torch.manual_seed(0)
    block = SparseMoeBlock(H, INTER, E, K, "topk_softmax")
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
        if skew:  # on positive inputs experts 2 and 3 (rank 1's) win for every token
            block.gate.weight[:2] = 0
            block.gate.weight[2] = 1.0
            block.gate.weight[3] = 0.5
    return block


def inputs(num_tokens: int, skew: bool) -> torch.Tensor:
    x = torch.randn(num_tokens, H, generator=torch.Generator().manual_seed(num_tokens))
    return x.abs() if skew else x


def rank_main(rank: int, init_file: str, cases, results) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        tp = TensorParallelGroup(rank=rank, world_size=2, process_group=dist.group.WORLD)
        out = []
        for num_tokens, skew in cases:
            full = make_block(skew)
            ep = ExpertParallelMoeBlock(H, INTER, E, K, "topk_softmax", True, tp)
            ep.load_state_dict({name: ep.experts.shard_weight(name, t) if name.startswith("experts.") else t
                                for name, t in full.state_dict().items()})
            tp.reset_counters()
            with torch.no_grad():
                y = ep(inputs(num_tokens, skew))
            # plain lists: a tensor put in a queue is shared memory that goes with the process that made it
            out.append((y.tolist(), tp.num_all_to_alls, tp.all_to_all_bytes, tp.expert_loads, tp.all_gather_bytes))
        results.put((rank, out))
        dist.destroy_process_group()
    except BaseException:
        results.put((rank, traceback.format_exc()))


CASES = [(1, False), (7, False), (6, True)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    init_file = str(tmp_path_factory.mktemp("ep") / "init")
    procs = [ctx.Process(target=rank_main, args=(r, init_file, CASES, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    for rank, out in got.items():
        assert not isinstance(out, str), f"rank {rank} raised:\n{out}"
    return got


@pytest.mark.parametrize("case", range(len(CASES)))
def test_two_ranks_equal_one_block_and_move_the_counted_bytes(two_ranks, case):
    num_tokens, skew = CASES[case]
    with torch.no_grad():
        want = make_block(skew)(inputs(num_tokens, skew))
    loads = [two_ranks[r][case][3][0] for r in range(2)]
    traffic = traffic_of_routing(loads, num_tokens, H, 4)
    for rank in range(2):
        y, num_all_to_alls, nbytes, _, gather_bytes = two_ranks[rank][case]
        torch.testing.assert_close(torch.tensor(y), want, rtol=0, atol=1e-6)
        assert num_all_to_alls == 3 and nbytes == traffic[rank].all_to_all_bytes
        assert gather_bytes == traffic[rank].gather_bytes
    assert sum(map(sum, loads)) == num_tokens * K
    if skew:  # every pair goes to rank 1's experts: rank 0's rows all travel, rank 1's none
        assert loads[0][:2] == loads[1][:2] == [0, 0]
        rows_of_rank0 = 3 * K  # tokens 0-2 of 6
        assert traffic[0].dispatch_bytes == rows_of_rank0 * H * 4 + 2 * 8 and traffic[0].combine_bytes == 0
        assert traffic[1].dispatch_bytes == 2 * 8 and traffic[1].combine_bytes == rows_of_rank0 * H * 4


def test_experts_that_do_not_divide_by_the_ranks_are_refused():
    with pytest.raises(ValueError, match=r"enable_expert_parallel: the model's 5 experts must divide by "
                                         r"tensor_parallel_size \(2\)"):
        LocalExperts(5, H, INTER, TensorParallelGroup(rank=0, world_size=2))

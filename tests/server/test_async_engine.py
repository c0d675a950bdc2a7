"""AsyncLLMEngine without HTTP: one loop owns the engine; generate() streams; leaving early aborts; a bad
request raises before any output; a failing step fails only its requests and the loop keeps serving."""

from __future__ import annotations

import asyncio

import pytest

from minengine import LLM, AsyncEngineArgs, AsyncLLMEngine, RequestOutputKind, SamplingParams

CONFIG = dict(max_model_len=256, num_kv_blocks=64, max_num_batched_tokens=64)


@pytest.fixture()
def aengine(bundled_model):
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=bundled_model, **CONFIG))
    yield engine
    engine.shutdown()


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_generate_streams_the_same_tokens_as_llm(bundled_model, aengine):
    prompts = ["ROMEO:", "JULIET:\nO Romeo", "HAMLET:"]
    want = LLM(bundled_model, **CONFIG).generate(prompts, SamplingParams(temperature=0, max_tokens=12),
                                                 use_tqdm=False)

    async def one(i, p):
        outs = [o async for o in aengine.generate(p, SamplingParams(temperature=0, max_tokens=12), f"r{i}")]
        return outs

    async def main():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    got = run(main())
    for outs, w in zip(got, want):
        assert [len(o.outputs[0].token_ids) for o in outs] == list(range(1, 13))  # cumulative, one per step
        assert outs[-1].finished and outs[-1].outputs[0].token_ids == w.outputs[0].token_ids
        assert outs[-1].outputs[0].text == w.outputs[0].text


def test_delta_outputs_concatenate_to_the_text(aengine):
    async def main():
        params = SamplingParams(temperature=0, max_tokens=20, output_kind=RequestOutputKind.DELTA)
        return [o async for o in aengine.generate("ROMEO:", params, "d")]

    outs = run(main())
    text = "".join(o.outputs[0].text for o in outs)
    ids = [t for o in outs for t in o.outputs[0].token_ids]
    assert len(ids) == 20 and text == aengine.engine.tokenizer.decode(ids)


def test_leaving_early_aborts_and_frees_blocks(aengine):
    engine = aengine.engine

    async def main():
        agen = aengine.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=200, ignore_eos=True), "early")
        async for out in agen:
            if len(out.outputs[0].token_ids) == 3:
                break
        await agen.aclose()
        await aengine.call(lambda e: None)  # the abort is applied before this runs
        return engine.has_unfinished_requests(), engine.kv_cache_manager.num_free_blocks

    busy, free = run(main())
    assert not busy and free == engine.num_kv_blocks
    assert engine.request_metrics["early"].finish_reason == "abort"


def test_cancelled_task_aborts(aengine):
    engine = aengine.engine

    async def consume():
        async for _ in aengine.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=200, ignore_eos=True),
                                        "task"):
            pass

    async def main():
        task = asyncio.ensure_future(consume())
        while not engine.request_metrics.get("task") or not engine.request_metrics["task"].num_output_tokens:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await aengine.call(lambda e: None)
        return engine.has_unfinished_requests()

    assert not run(main())


def test_bad_request_raises_value_error_and_others_continue(aengine):
    async def main():
        good = asyncio.ensure_future(_collect(aengine, "ROMEO:", "good"))
        with pytest.raises(ValueError, match="prompt is empty"):
            await _collect(aengine, "", "bad")
        with pytest.raises(ValueError, match="request_id"):
            await asyncio.gather(_collect(aengine, "ROMEO:", "same"), _collect(aengine, "ROMEO:", "same"))
        return await good

    outs = run(main())
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 16


async def _collect(aengine, prompt, rid):
    return [o async for o in aengine.generate(prompt, SamplingParams(temperature=0, max_tokens=16), rid)]


def test_failing_step_fails_its_requests_and_the_loop_keeps_serving(aengine, monkeypatch):
    engine = aengine.engine
    real_step, calls = engine.step, []

    def flaky_step():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return real_step()

    monkeypatch.setattr(engine, "step", flaky_step)

    async def main():
        with pytest.raises(RuntimeError, match="boom"):
            await _collect(aengine, "ROMEO:", "doomed")
        return await _collect(aengine, "JULIET:", "after")

    outs = run(main())
    assert outs[-1].finished and engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
    assert engine.request_metrics["doomed"].finish_reason == "abort"


def test_n_greater_than_one_and_step_subscription(aengine):
    async def main():
        sub = aengine.subscribe_steps()
        params = SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=6, output_kind=RequestOutputKind.FINAL_ONLY)
        outs = [o async for o in aengine.generate("ROMEO:", params, "par")]
        traces = []
        while (t := await sub.get(timeout=0.5)) is not None:
            traces.append(t)
        aengine.unsubscribe_steps(sub)
        return outs, traces

    outs, traces = run(main())
    assert len(outs) == 1 and [c.index for c in outs[0].outputs] == [0, 1] and outs[0].finished
    assert {c.request_id for t in traces for c in t.chunks} == {"0_par", "1_par"}
    assert [t.step for t in traces] == list(range(traces[0].step, traces[0].step + len(traces)))


def test_history_is_trimmed(bundled_model):
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=bundled_model, **CONFIG), max_history_steps=10)
    try:
        async def main():
            for i in range(4):
                await _collect(engine, "ROMEO:", f"h{i}")

        run(main())
        e = engine.engine
        assert len(e.traces) <= 11 and e.traces[-1].step == e.num_steps - 1 and e.num_steps == 64
        assert len(e.request_metrics) == 4
    finally:
        engine.shutdown()


def test_a_broken_loop_fails_waiting_callers_instead_of_hanging(aengine, monkeypatch):
    from minengine.entrypoints.async_engine import EngineDeadError

    engine = aengine.engine

    def broken(*args, **kwargs):
        raise RuntimeError("corrupt")

    async def main():
        monkeypatch.setattr(engine, "step", broken)
        monkeypatch.setattr(engine, "abort_request", broken)  # cleaning up fails too: the loop cannot go on
        with pytest.raises(EngineDeadError, match="corrupt"):
            await _collect(aengine, "ROMEO:", "victim")
        with pytest.raises(EngineDeadError):
            await aengine.check_health()

    run(main())

"""AsyncLLMEngine: one engine loop owns the ``LLMEngine``; callers only enqueue and await (vLLM's ``AsyncLLM``).

The loop is one asyncio task. Between steps it applies what callers queued (new requests, aborts, tokenizer
calls), then runs ``LLMEngine.step()`` in a worker thread (so the event loop keeps serving HTTP while the model
computes), then hands each ``RequestOutput`` to its request's queue and each ``StepTrace`` to the step-feed
subscribers. Nothing else touches the engine, so no lock is needed: the engine is used by exactly one thread
at a time, and an abort queued during a step is applied before the next step is scheduled, so the
aborted request's KV blocks are free by then.

A step that fails because of particular requests (``RequestError``: their detokenizing or logprobs raised) fails
those requests alone: they are aborted, their callers get the error, and the others go on from the rolled-back
step as if nothing had happened. Any other failure of a step fails every request in flight (its cause is
unknown), and the loop keeps serving new ones. ``drain(timeout)`` is the server's graceful stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor

from minengine.engine.llm_engine import LLMEngine, Prompt
from minengine.exceptions import RequestError
from minengine.metrics.history import EngineHistory
from minengine.metrics.trace import StepTrace
from minengine.outputs import RequestOutput
from minengine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop stopped (shut down or failed); requests cannot be served."""


class EngineDrainingError(EngineDeadError):
    """The server is shutting down: it takes no new request, and ends those still running at the drain's
    deadline with this error."""


class RequestStream:
    """The outputs of one request, as the engine loop delivers them (an asyncio queue).

    ``get()`` returns the next ``RequestOutput`` or raises the error the loop put there. ``finished`` is True
    once the last output has been taken.
    """

    def __init__(self, request_id: str):
        self.request_id = request_id
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.finished = False

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    async def get(self) -> RequestOutput:
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item


class StepSubscription:
    """One subscriber of the step feed: a bounded queue of ``StepTrace``s. A subscriber too slow to keep up
    loses the oldest steps; ``num_dropped`` counts them (each trace's ``step`` number shows the gap)."""

    def __init__(self, max_queue: int = 1024):
        self._queue: deque[StepTrace] = deque(maxlen=max_queue)
        self._event = asyncio.Event()
        self.num_dropped = 0
        self.closed = False

    def close(self) -> None:
        """No more traces: ``get`` returns None from now on (the engine is shutting down)."""
        self.closed = True
        self._event.set()

    def put(self, trace: StepTrace) -> None:
        if len(self._queue) == self._queue.maxlen:
            self.num_dropped += 1
        self._queue.append(trace)
        self._event.set()

    async def get(self, timeout: float | None = None) -> StepTrace | None:
        """The next trace, or None after ``timeout`` seconds without one (or once closed)."""
        while not self._queue and not self.closed:
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except asyncio.TimeoutError:
                return None
        return self._queue.popleft() if self._queue else None


class AsyncLLMEngine:
    """An ``LLMEngine`` served by one asyncio loop (vLLM's ``AsyncLLMEngine``).

    Args:
        engine: the engine; from now on only the loop may use it.
        max_history_steps: the engine keeps at most this many ``StepTrace``s and this many finished
            requests' ``RequestMetrics`` (older ones are dropped; the engine's ``summary()`` covers what is kept).
        max_history_bytes: and at most this many bytes of them (``metrics/history.py``), so a long-running
            server's memory levels off; None = the engine's ``EngineConfig.max_history_bytes``.

    The loop starts with the first request (or ``start()``) inside the running event loop.
    """

    def __init__(self, engine: LLMEngine, max_history_steps: int = 10_000, max_history_bytes: int | None = None):
        self.engine = engine
        self.max_history_steps = max_history_steps
        self.history = EngineHistory(engine, max_history_bytes or engine.config.max_history_bytes, max_history_steps)
        self._streams: dict[str, RequestStream] = {}
        self._pending: deque[Callable[[], None]] = deque()
        self._subscribers: set[StepSubscription] = set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minengine-step")
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.errored: BaseException | None = None
        self.draining = False  # set by ``drain``: no new requests
        self.started_unix_time = time.time()

    @classmethod
    def from_engine_args(cls, engine_args, **kwargs) -> AsyncLLMEngine:
        """vLLM's constructor: ``AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=...))``."""
        return cls(LLMEngine.from_engine_args(engine_args), **kwargs)

    # ---- the loop --------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine loop in the running event loop (again, if a previous loop has gone)."""
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._loop is loop:
            return
        if self._executor is None:
            raise EngineDeadError("the engine has been shut down")
        self._loop, self._wakeup = loop, asyncio.Event()
        self._task = loop.create_task(self._run(), name="minengine-engine-loop")
        self._task.add_done_callback(self._on_loop_done)

    def _on_loop_done(self, task: asyncio.Task) -> None:
        """The loop ended: cancelled (shutdown, or its event loop closing) or broken. Either way no output will
        come, so every waiting caller gets an ``EngineDeadError`` instead of waiting forever."""
        if not task.cancelled() and task.exception() is not None:
            self.errored = task.exception()
            logger.error("engine loop died: %r", self.errored)
        for stream in self._streams.values():
            stream.put(EngineDeadError(f"the engine loop stopped: {self.errored or 'shut down'}"))
        self._streams.clear()

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        while True:
            while self._pending:
                op = self._pending.popleft()
                try:
                    op()
                    self.history.record()  # an op may have finished requests (abort): counted before the next op
                except Exception:  # ops report their own errors; this guards the loop against a bug in one
                    logger.exception("engine loop operation failed")
            if not engine.has_unfinished_requests():
                self._wakeup.clear()
                if not self._pending:
                    await self._wakeup.wait()
                continue
            num_traces = len(engine.traces)
            try:
                outputs = await loop.run_in_executor(self._executor, engine.step)
            except RequestError as exc:  # these requests' fault: fail them alone, the rest retry the step
                logger.error("engine step failed for requests %s: %r", exc.request_ids, exc.__cause__ or exc)
                self._fail(exc.request_ids, exc)
                continue
            except Exception as exc:  # a bug in a step: fail its requests, free everything, keep serving
                logger.exception("engine step failed")
                self._fail_all(exc)  # if even that fails, the loop ends and _on_loop_done tells everyone
                continue
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    stream.put(out)
                    if out.finished:
                        del self._streams[out.request_id]
            for trace in engine.traces[num_traces:]:
                for sub in self._subscribers:
                    sub.put(trace)
            self.history.record()

    def _fail_all(self, exc: Exception) -> None:
        ids = list(self._streams)
        self.engine.abort_request(ids + list(self.engine.scheduler.requests))
        for rid in ids:
            self._streams.pop(rid).put(RuntimeError(f"engine step failed: {exc}"))

    def _fail(self, request_ids: list[str], exc: BaseException) -> None:
        """Abort these requests (their blocks are free at once) and give their callers ``exc``."""
        self.engine.abort_request(request_ids)
        for rid in request_ids:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream.put(exc)

    def _submit(self, op: Callable[[], None]) -> None:
        """Run ``op`` in the engine loop before its next step."""
        self.start()
        self._pending.append(op)
        self._wakeup.set()

    async def call(self, fn: Callable[[LLMEngine], object]):
        """Run ``fn(engine)`` in the engine loop between steps and return its result (or raise its error).
        For anything that reads or changes the engine: tokenizing, resetting the prefix cache, a summary."""
        if self.errored is not None:
            raise EngineDeadError(f"the engine loop failed: {self.errored}")
        future = asyncio.get_running_loop().create_future()

        def op() -> None:
            if future.cancelled():
                return
            try:
                future.set_result(fn(self.engine))
            except Exception as exc:
                future.set_exception(exc)

        self._submit(op)
        return await future

    # ---- requests --------------------------------------------------------------------------------------
    async def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None, *,
                          priority: int = 0, deadline: float | None = None) -> RequestStream:
        """Queue a request and return the stream of its outputs.

        Raises:
            ValueError: as ``LLMEngine.add_request`` (raised here, before any output, so an HTTP handler can
                answer 400).
            EngineDrainingError: the server is shutting down.
        """
        (stream,) = await self.add_requests([(request_id, prompt, params)], priority=priority, deadline=deadline)
        return stream

    async def add_requests(self, requests: list[tuple[str, Prompt, SamplingParams | None]], *, priority: int = 0,
                           deadline: float | None = None) -> list[RequestStream]:
        """Queue several requests at once, ``(request_id, prompt, params)`` each, and return their streams: all
        are validated first, then all queued in one go between two steps (so a batch costs one round trip, and
        a bad one queues none).

        Raises:
            ValueError: as ``LLMEngine.add_request``, for the first bad request (none is queued then).
            EngineDrainingError: the server is shutting down.
        """
        if self.draining:
            raise EngineDrainingError("the server is shutting down and takes no new requests")
        streams = [RequestStream(rid) for rid, _, _ in requests]

        def add(engine: LLMEngine) -> None:
            if self.draining:
                raise EngineDrainingError("the server is shutting down and takes no new requests")
            groups = [engine.make_requests(rid, prompt, params, priority=priority, deadline=deadline)
                      for rid, prompt, params in requests]
            if len({g.request_id for g in groups}) < len(groups):
                raise ValueError("request_id: the same id twice in one batch")
            for group, stream in zip(groups, streams):
                engine.enqueue(group)
                self._streams[group.request_id] = stream

        try:
            await self.call(add)
        except asyncio.CancelledError:  # the caller left while the requests were being added
            for s in streams:
                self.abort_nowait(s.request_id)
            raise
        return streams

    def abort_nowait(self, request_id: str) -> None:
        """Abort a request before the engine's next step (callable from anywhere in the event loop, also
        from a ``finally`` of a cancelled task: it does not await)."""
        def abort() -> None:
            self._streams.pop(request_id, None)
            self.engine.abort_request(request_id)

        # Never starts a loop (this may run while an event loop shuts down): a stopped loop applies it first
        # thing when it starts again, before any step.
        self._pending.append(abort)
        if self.is_running:
            self._wakeup.set()

    async def abort(self, request_id: str) -> None:
        """vLLM's ``abort``: finish the request with reason "abort"; its blocks are free once this returns."""
        await self.call(lambda engine: (self._streams.pop(request_id, None), engine.abort_request(request_id)))

    async def generate(self, prompt: Prompt, sampling_params: SamplingParams | None, request_id: str, *,
                       priority: int = 0, deadline: float | None = None) -> AsyncGenerator[RequestOutput, None]:
        """vLLM's ``AsyncLLMEngine.generate``: the request's outputs as they come (``output_kind`` decides
        cumulative, delta or final-only). Leaving the loop early (``break``, a cancelled task, a closed
        client) aborts the request.

        Raises:
            ValueError: as ``LLMEngine.add_request``, on the first iteration.
        """
        stream = await self.add_request(request_id, prompt, sampling_params, priority=priority, deadline=deadline)
        try:
            while True:
                out = await stream.get()
                yield out
                if out.finished:
                    return
        finally:
            if not stream.finished:
                self.abort_nowait(request_id)

    # ---- the step feed ---------------------------------------------------------------------------------
    def subscribe_steps(self, max_queue: int = 1024) -> StepSubscription:
        """Receive every ``StepTrace`` from now on (until ``unsubscribe_steps``)."""
        self.start()
        sub = StepSubscription(max_queue)
        self._subscribers.add(sub)
        return sub

    def unsubscribe_steps(self, sub: StepSubscription) -> None:
        self._subscribers.discard(sub)

    # ---- conveniences (vLLM's names) ---------------------------------------------------------------------
    async def get_tokenizer(self):
        return self.engine.get_tokenizer()

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return await self.call(lambda engine: engine.reset_prefix_cache(reset_running_requests))

    async def check_health(self) -> None:
        """Raises ``EngineDeadError`` when the loop has stopped (shut down, or broken: ``errored``)."""
        if self.errored is not None:
            raise EngineDeadError(f"the engine loop failed: {self.errored}")
        if self._executor is None or (self._task is not None and self._task.done()):
            raise EngineDeadError("the engine loop is not running")

    @property
    def num_unfinished_streams(self) -> int:
        return len(self._streams)

    async def drain(self, timeout: float, poll_s: float = 0.05) -> int:
        """The graceful stop: take no new requests, let those in flight finish for up to ``timeout`` seconds,
        then end the rest: each is aborted (its blocks freed) and its caller gets an ``EngineDrainingError`` (a
        streaming client an error chunk). Step-feed subscribers are closed. Returns how many were ended.
        (vLLM's ``--shutdown-timeout``; its 0 aborts at once, as here.)"""
        self.draining = True
        for sub in list(self._subscribers):
            sub.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        while self._streams and self.is_running and loop.time() < deadline:
            await asyncio.sleep(poll_s)
        left = list(self._streams)
        if left:
            error = EngineDrainingError(f"the server is shutting down: the request was still running after the "
                                        f"{timeout:g} s drain")
            if self.is_running:
                await self.call(lambda engine: self._fail(left, error))
            else:
                for rid in left:
                    self._streams.pop(rid).put(error)
        return len(left)

    async def shutdown_async(self) -> None:
        """Stop the loop (pending requests get an ``EngineDeadError``) and the step thread."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.shutdown()

    def shutdown(self) -> None:
        """Stop the step thread (vLLM's ``shutdown``); the engine stays usable directly."""
        if self._task is not None and not self._task.done() and not self._loop.is_closed():
            self._task.cancel()
        for stream in self._streams.values():
            stream.put(EngineDeadError("the engine was shut down"))
        self._streams.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

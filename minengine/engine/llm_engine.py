"""LLMEngine: vLLM's online interface, ``add_request`` then ``step()`` until done.

One step, one direction: schedule (``Scheduler.schedule()`` -> ``SchedulerOutput``) -> execute
(``ModelRunner.execute()``, then detokenize and stop strings) -> commit (``Scheduler.update_from_output()``) ->
outputs (``RequestOutput``s; the recorder keeps the ``StepTrace``, and unless ``disable_log_stats`` the
Prometheus series: ``metrics/prometheus_recorder.py``).
Async scheduling is its own engine (``AsyncSchedulingEngine``), built through ``engine/engine_doors.py``.
torch is imported where a model is loaded, not here: an engine on a model-free runner (``minengine.fleet``)
schedules without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from minengine.config import EngineConfig
from minengine.core.doors import scheduler_for_engine
from minengine.core.preempt_between_steps import preempt_running_by_recompute
from minengine.core.scheduler_output import SchedulerOutput
from minengine.engine.detokenizer import Detokenizers
from minengine.engine.engine_doors import engine_class
from minengine.engine.engine_statistics import EngineStatistics
from minengine.engine.input_processor import InputProcessor, Prompt
from minengine.engine.logprobs_positions import prepare_logprobs, record_logprobs
from minengine.engine.model_setup import eos_token_id, load_model, make_kv_cache_manager, make_runner
from minengine.engine.output_processor import OutputProcessor
from minengine.engine.parallel_sampling import ParentRequest
from minengine.metrics.prometheus_recorder import make_recorder
from minengine.metrics.recorder import ScheduledStep
from minengine.outputs import RequestMetrics, RequestOutput
from minengine.request import Request, RequestGroup, RequestStatus
from minengine.sampling_params import SamplingParams
from minengine.timing.wall_clock import Clock, as_clock
from minengine.value_checks import as_request_ids
from minengine.worker.kv_pool import size_kv_pool


class LLMEngine(EngineStatistics):
    """A serving engine over one model: requests in, ``RequestOutput``s out, one ``step()`` at a time.

    Args:
        config: the engine settings (``EngineConfig``); or use ``LLMEngine.from_config(**kwargs)``. With
            ``async_scheduling`` the engine built is an ``AsyncSchedulingEngine`` (a subclass).
        clock: the time source in seconds (default ``time.perf_counter``, the wall clock): a plain callable, or
            a clock with step hooks (``minengine.timing``: ``ModelledClock``, ``MeasuredClock``, ``make_clock``)
            that ``step()`` tells where each step begins (``begin_step()``) and ends
            (``end_step(scheduler_output)``). Arrival, scheduling, token and finish times all come from it.
        runner: a model-free stand-in for the ``ModelRunner`` (``minengine.fleet.TokenFreeRunner``): the engine
            then loads no weights, no tokenizer and no torch, and takes the model's sizes from
            ``runner.model_config`` (``vocab_size``, ``max_position_embeddings``, ``eos_token_id``),
            ``runner.kv_bytes_per_block(block_size)`` and ``runner.tokenizer`` if it has one (else no text).
            Scheduling, metrics and traces are unchanged: this is how the fleet simulator runs the engine's own
            scheduler on a modelled clock. None: load ``config.model``.

    Raises:
        ValueError: bad settings, or settings that do not fit the model (``max_model_len``, KV pool).
    """

    schedules_ahead = False  # async scheduling: step N+1 is scheduled before step N's tokens are known

    def __new__(cls, config: EngineConfig, clock: Clock | Callable[[], float] = time.perf_counter, runner=None):
        """``LLMEngine(config)`` builds the subclass ``config``'s doors choose (``engine/engine_doors.py``); a
        subclass asked for by name, or a runner handed in (the model in worker processes), keeps the class."""
        return super().__new__(engine_class(config, cls) if cls is LLMEngine and runner is None else cls)

    def __init__(self, config: EngineConfig, clock: Clock | Callable[[], float] = time.perf_counter,
                 runner=None):
        self.config = config
        self.clock = as_clock(clock)
        loaded = load_model(config, runner)  # a model-free runner: its sizes, nothing loaded
        self.model, self.hf_config, self.model_path, self.tokenizer = (loaded.model, loaded.hf_config,
                                                                       loaded.model_path, loaded.tokenizer)
        config.check_against_model(self.hf_config.max_position_embeddings)
        self.eos_token_id = eos_token_id(self.hf_config, self.tokenizer)
        pool = size_kv_pool(config, loaded.kv_bytes_per_block, loaded.device)
        self.num_kv_blocks, self.num_swap_blocks = pool.num_blocks, pool.num_swap_blocks
        # Every rank holds its heads' slice of every block: bytes_per_block is one rank's; the total is all ranks'.
        self.kv_cache_bytes = pool.num_blocks * loaded.kv_bytes_per_block * config.tensor_parallel_size
        self.kv_cache_manager = make_kv_cache_manager(config, pool.num_blocks, self.hf_config)
        self.scheduler = scheduler_for_engine(config, self.kv_cache_manager, self.num_swap_blocks,
                                              self.schedules_ahead)
        self.runner = runner if runner is not None else make_runner(config, loaded, pool)
        self.detokenizers = Detokenizers(self.tokenizer)
        self.request_metrics: dict[str, RequestMetrics] = {}
        self._past_metrics: list[RequestMetrics] = []  # finished requests whose id was used again
        self._undelivered: list[tuple[Request, str]] = []  # finished (timed out) in a step that raised
        self.input_processor = InputProcessor(config, self.tokenizer, self.hf_config.vocab_size, self.eos_token_id,
                                              self.num_kv_blocks, self.clock, self._request_id_in_use,
                                              getattr(self.runner, "logits_processors", None))
        self.output_processor = OutputProcessor(self.tokenizer)
        self.recorder = make_recorder(config, self.scheduler, self.kv_cache_manager, self.num_kv_blocks,
                                      self.num_swap_blocks, self.clock, lambda: self.runner.last_swap_time_s)
        self.stat_logger, self.log_stats = self.recorder.stat_logger, self.recorder.log_stats  # Prometheus series

    def shutdown(self) -> None:
        """Stop the worker processes, if any (``minengine.executor``; also done when the engine is garbage
        collected and at interpreter exit). The engine runs no step afterwards. Idempotent."""
        stop = getattr(self.runner, "shutdown", None)
        if stop is not None:
            stop()

    @classmethod
    def from_config(cls, **kwargs) -> LLMEngine:
        """``LLMEngine.from_config(model=..., block_size=...)``: the ``EngineConfig`` fields as keywords."""
        return cls(EngineConfig(**kwargs))

    @classmethod
    def from_engine_args(cls, engine_args, clock: Clock | Callable[[], float] = time.perf_counter) -> LLMEngine:
        """vLLM's constructor: ``LLMEngine.from_engine_args(EngineArgs(model=...))`` (see ``EngineArgs``)."""
        return cls(engine_args.create_engine_config(), clock=clock)

    def get_tokenizer(self):
        return self.tokenizer

    @property
    def structured_output_manager(self):
        """The grammar compiler and matchers of structured outputs (``None`` until the first such request)."""
        return self.input_processor.structured_output_manager

    # ---- requests -------------------------------------------------------------------------------------
    def prompt_to_token_ids(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """A prompt as (text or None, token ids); see ``InputProcessor.prompt_to_token_ids``."""
        return self.input_processor.prompt_to_token_ids(prompt)

    def make_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                     arrival_time: float | None = None, priority: int = 0,
                     deadline: float | None = None) -> Request:
        """Validate a request (``n == 1``) without adding it; see ``InputProcessor.make_request``."""
        return self.input_processor.make_request(request_id, prompt, params, arrival_time, priority, deadline)

    def make_requests(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                      arrival_time: float | None = None, priority: int = 0,
                      deadline: float | None = None) -> RequestGroup:
        """Validate a request of any ``n`` without adding it; see ``InputProcessor.make_requests``."""
        return self.input_processor.make_requests(request_id, prompt, params, arrival_time, priority, deadline)

    def _request_id_in_use(self, request_id: str) -> bool:
        return request_id in self.scheduler.requests or self.output_processor.is_in_use(request_id)

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    arrival_time: float | None = None, priority: int = 0, deadline: float | None = None) -> str:
        """Queue a request and return its id (vLLM: ``LLMEngine.add_request``; ``priority`` as vLLM's,
        smaller = more urgent; ``deadline`` in engine-clock seconds, see ``make_request``; ``n > 1`` fans out
        into child requests whose outputs come back gathered under ``request_id``).
        Raises ``ValueError`` as ``make_request``."""
        self.enqueue(self.make_requests(request_id, prompt, params, arrival_time, priority, deadline))
        return request_id

    def enqueue(self, request: Request | RequestGroup) -> None:
        """Queue a request built by ``make_request`` (or all of a ``make_requests`` group). The id of a
        finished request may be used again: the summary keeps the metrics of both."""
        group = request if isinstance(request, RequestGroup) else RequestGroup(
            request.request_id, request.sampling_params, [request])
        parent = None
        for index, child in enumerate(group.requests):
            self.scheduler.add_request(child)
            if child.request_id in self.request_metrics:
                self._past_metrics.append(self.request_metrics.pop(child.request_id))
            self.detokenizers.add(child)
            self.request_metrics[child.request_id] = RequestMetrics(arrival_time=child.arrival_time,
                                                                    num_prompt_tokens=child.num_prompt_tokens)
            if group.is_parent and parent is None:
                parent = ParentRequest(group.request_id, group.params.n, group.params.output_kind, child,
                                       self.request_metrics[child.request_id])
            self.output_processor.add_request(child, index, parent)
        self.recorder.on_requests_added(group.params.n, [r.request_id for r in group.requests])

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Finish requests with reason "abort" in whatever state they are, freeing their blocks (an ``n > 1``
        parent id aborts all its children). Unknown and already finished ids are ignored (as in vLLM).

        Raises:
            VLLMValidationError: ``request_id`` is neither a string nor an iterable of strings.
        """
        ids = [child for rid in as_request_ids(request_id) for child in self.output_processor.children_of(rid)]
        now = self.clock()
        aborted = self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
        for request in aborted:
            self.request_metrics[request.request_id].on_finished(request, now)
            self.detokenizers.remove(request.request_id)
        self.output_processor.abort([r.request_id for r in aborted])
        self.recorder.on_requests_finished(aborted, self.request_metrics)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.requests)

    # ---- one step -------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, execute (run the model, sample, detokenize), commit, outputs: an output for every request
        that got a token or finished in this step (cumulative, delta or final-only as its ``output_kind``; one per
        parent of ``n > 1`` children).

        A step is a transaction. If the forward, the sampler, the detokenizer or the logprobs raise (or Ctrl-C
        arrives), the scheduler rolls the step back (``Scheduler.rollback``): as if it had not been scheduled (its
        preemptions stand, recorded in a ``rolled_back`` trace; no block it would have written is in the prefix
        cache), and the exception propagates. The next ``step()`` serves the same requests again, or the caller
        aborts them; outputs a failed step owed (requests past their deadline) come with the next step. Once the
        step commits nothing raises: a trace or statistic that fails is logged, counted in
        ``num_bookkeeping_errors``, and the outputs go out.

        Raises:
            RequestError: the step failed because of the requests in its ``request_ids`` (rolled back).
            RuntimeError: if unfinished requests exist but none could be scheduled (a bug guard: admission
                checks make this impossible, and it is better to fail than to spin).
        """
        start = self._begin_step()
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            return self._idle_step(scheduler_output)
        step = self._scheduled_step(scheduler_output, start)
        try:  # everything that may fail, before anything is committed
            sampled = self.runner.execute(scheduler_output)
            tokens_to_commit, detoks = self._detokenize(step, sampled)
            logprobs = self._prepare_logprobs(step, tokens_to_commit)
        except BaseException:
            self.scheduler.rollback(scheduler_output)
            self.clock.end_step(SchedulerOutput())  # the step did not happen: it costs no modelled time
            self.recorder.on_rolled_back(step, start, self.request_metrics)
            raise
        return self._commit(step, start, sampled, tokens_to_commit, detoks, logprobs)

    def _begin_step(self) -> float:
        """Start a step on the clock; requests past their deadline finish first. Returns the step's start."""
        self.clock.begin_step()
        start = self.clock()
        self._undelivered += self._finish_timed_out(start)
        return start

    def _scheduled_step(self, scheduler_output: SchedulerOutput, start: float) -> ScheduledStep:
        """A scheduled step and the pool it was scheduled on (what its trace records)."""
        for rid in scheduler_output.preempted_ids:  # preemptions stand even if the step fails
            self.request_metrics[rid].num_preemptions += 1
        return ScheduledStep(scheduler_output, start, self.recorder.pool_state(),
                             list(scheduler_output.preempted_ids))

    def _idle_step(self, scheduler_output: SchedulerOutput) -> list[RequestOutput]:
        """Nothing scheduled (and nothing in flight): only the outputs of requests past their deadline."""
        self.clock.end_step(scheduler_output)
        if self.has_unfinished_requests():
            raise RuntimeError("no request could be scheduled although some are unfinished")
        return self._deliver_timed_out()

    def _deliver_timed_out(self) -> list[RequestOutput]:
        timed_out = self._take_undelivered()
        self.recorder.on_finished_without_step([r for r, _ in timed_out], self.request_metrics)
        return self.output_processor.make_outputs(timed_out, self.request_metrics)

    def _sampling_ids(self, step: ScheduledStep) -> list[str]:
        """The requests whose sampled tokens the step keeps: every request that sampled."""
        return [s.request_id for s in step.scheduler_output.scheduled if s.sample]

    def _detokenize(self, step: ScheduledStep, sampled: dict[str, list[int]]) -> tuple[dict, dict]:
        """The tokens each sampling request keeps, and its detokenizer after them (``Detokenizers.detokenize``:
        nothing is committed). Raises ``RequestError`` naming the request whose detokenizing failed."""
        return self.detokenizers.detokenize(
            sampled, self._sampling_ids(step),
            lambda rid, tokens: self.scheduler.num_tokens_before_stop(self.scheduler.requests[rid], tokens),
            self.output_processor.caller_id)

    def _prepare_logprobs(self, step: ScheduledStep, tokens_to_commit: dict) -> dict:
        """The step's logprobs as positions (``OutputProcessor.prepare_logprobs``), before anything is committed:
        only the tokens kept (a stop may end a run of accepted proposals).

        Raises:
            RequestError: building one request's positions failed; names it (the step is rolled back).
        """
        logprobs, prompt_logprobs = self.runner.last_logprobs, self.runner.last_prompt_logprobs
        if not logprobs and not prompt_logprobs:  # nobody in the step asked for logprobs
            return {}
        if logprobs and step.scheduler_output.num_spec_tokens:
            logprobs = {rid: lps[:len(tokens_to_commit[rid])] for rid, lps in logprobs.items()
                        if rid in tokens_to_commit}
        return prepare_logprobs(self.output_processor, logprobs, prompt_logprobs)

    def _record_logprobs(self, logprobs: dict) -> None:
        """Keep what ``_prepare_logprobs`` built (nothing when no request of the step asked for logprobs)."""
        if logprobs:
            record_logprobs(self.output_processor, logprobs)

    def _commit(self, step: ScheduledStep, start: float, sampled: dict[str, list[int]], tokens_to_commit: dict,
                detoks: dict, logprobs: dict) -> list[RequestOutput]:
        """Commit a step that ran (``update_from_output``), then metrics, outputs and its ``StepTrace``. Nothing
        here may raise, or the step's outputs would be lost: the recorder guards the trace and statistics."""
        scheduler_output = step.scheduler_output
        self._record_logprobs(logprobs)
        got_token, finished = self.scheduler.update_from_output(scheduler_output, tokens_to_commit)
        self.clock.end_step(scheduler_output)  # a modelled clock advances by this step's cost here
        now = self.clock()
        self._mark_first_scheduled(scheduler_output.admitted_ids, start)
        for request in got_token:
            self.request_metrics[request.request_id].on_tokens(request, len(tokens_to_commit[request.request_id]), now)
            stop_string = self.detokenizers.commit(request.request_id, detoks[request.request_id])
            if stop_string is not None:
                finished += self._finish_by_stop_string(request, stop_string)
        for request in finished:
            self.request_metrics[request.request_id].on_finished(request, now)
        timed_out = self._take_undelivered()
        answered = {r.request_id: r for r in got_token + finished}  # got a token, finished, or both
        outputs = self.output_processor.make_outputs(
            timed_out + [(r, self.detokenizers.text(rid, r.is_finished)) for rid, r in answered.items()],
            self.request_metrics)
        for request in finished:
            self.detokenizers.remove(request.request_id)
        self.recorder.on_step(step, start, now, sampled, tokens_to_commit, got_token, finished,
                              [r for r, _ in timed_out], self.request_metrics)
        return outputs

    def _mark_first_scheduled(self, admitted_ids: list[str], start: float) -> None:
        for rid in admitted_ids:
            self.request_metrics[rid].on_scheduled(start)

    def _finish_by_stop_string(self, request: Request, stop_string: str) -> list[Request]:
        """The request's text completed ``stop_string``; returns the request if that finished it now."""
        request.stop_reason = stop_string  # it wins over "length" when the last allowed token completes it
        if request.is_finished:
            request.status = RequestStatus.FINISHED_STOPPED
            return []
        return self.scheduler.finish_requests([request.request_id], RequestStatus.FINISHED_STOPPED)

    def _take_undelivered(self) -> list[tuple[Request, str]]:
        done, self._undelivered = self._undelivered, []
        return done

    def _finish_timed_out(self, now: float) -> list[tuple[Request, str]]:
        """Finish every unfinished request whose deadline has passed with reason "timeout" (its blocks and
        swap blocks are freed); returns them with their final text."""
        expired = self.scheduler.past_deadline(now)
        done = []
        for request in self.scheduler.finish_requests(expired, RequestStatus.FINISHED_TIMEOUT):
            self.request_metrics[request.request_id].on_finished(request, now)
            done.append((request, self.detokenizers.text(request.request_id, True)))
            self.detokenizers.remove(request.request_id)
        return done

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix (vLLM's ``reset_prefix_cache``). Only when no request holds a block
        (the prefix cache of running requests is in use): returns False and changes nothing otherwise. With
        ``reset_running_requests`` (vLLM's) the running requests are first preempted by recompute
        (``core/preempt_between_steps.py``), so the reset always happens; they go on from where they
        were, recomputing their KV."""
        if reset_running_requests:
            self.recorder.on_running_preempted(preempt_running_by_recompute(self.scheduler))
        if self.kv_cache_manager.num_used_blocks:
            return False
        self.kv_cache_manager.reset_prefix_cache()
        self.recorder.on_prefix_cache_reset()
        return True

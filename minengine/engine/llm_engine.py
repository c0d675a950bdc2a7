"""LLMEngine: vLLM's online interface, ``add_request`` then ``step()`` until done.

One step, one direction: ``Scheduler.schedule()`` -> ``SchedulerOutput`` -> ``ModelRunner.execute()`` ->
``Scheduler.update_from_output()`` -> detokenize and stop strings -> ``RequestOutput`` + ``StepTrace``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from minengine.config import EngineConfig
from minengine.core.kv_cache_manager import KVCacheManager, cdiv
from minengine.core.policies import PolicySettings
from minengine.core.scheduler import Scheduler
from minengine.core.scheduler_output import SchedulerOutput
from minengine.engine.detokenizer import IncrementalDetokenizer
from minengine.engine.input_processor import InputProcessor, Prompt
from minengine.engine.output_processor import OutputProcessor
from minengine.engine.parallel_sampling import ParentRequest, RequestGroup
from minengine.exceptions import RequestError, VLLMValidationError, show
from minengine.metrics.prometheus import PrometheusStatLogger
from minengine.metrics.reader import Metric, get_metrics_snapshot
from minengine.metrics.stats import ServingSummary, summarize
from minengine.metrics.trace import ScheduledChunk, StepTrace
from minengine.outputs import RequestMetrics, RequestOutput
from minengine.request import Request, RequestStatus
from minengine.sampling_params import SamplingParams
from minengine.timing.clocks import Clock, as_clock

# torch is imported where a model is loaded, not here: an engine on a model-free runner (``minengine.fleet``)
# schedules without it.
DEFAULT_MAX_KV_BLOCKS = 2048
logger = logging.getLogger(__name__)


@dataclass
class _PendingStep:
    """A scheduled step until its output is processed: what its trace records from scheduling time, and (async
    scheduling) its requests, to know which finished while it was in flight."""

    sched: SchedulerOutput
    scheduled_at: float
    trace_blocks: dict
    num_free_blocks: int
    num_cached_free_blocks: int
    requests: dict[str, Request] | None


def _available_bytes(device: str) -> int | None:
    """Memory a new allocation can use on the device (CUDA: free) or in the host (CPU: psutil's "available",
    which counts reclaimable page cache, unlike MemFree), in bytes; None when it cannot be read."""
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0]
    try:
        import psutil

        return psutil.virtual_memory().available
    except (ImportError, OSError, AttributeError):  # psutil missing or not on this platform
        return None


def _check_memory(num_bytes: int, device: str, field: str) -> None:
    """Fail early, naming the setting, when a cache would not fit in free memory (instead of an OOM later)."""
    available = _available_bytes(device)
    if available is not None and num_bytes > available:
        raise VLLMValidationError(f"{field}: the cache needs {num_bytes / 2**30:.1f} GiB but only "
                                  f"{available / 2**30:.1f} GiB of {device} memory is free")


class LLMEngine:
    """A serving engine over one model: requests in, ``RequestOutput``s out, one ``step()`` at a time.

    Args:
        config: the engine settings (``EngineConfig``); or use ``LLMEngine.from_config(**kwargs)``.
        clock: the time source in seconds (default ``time.perf_counter``, the wall clock): a plain callable, or
            a clock with step hooks (``minengine.timing``: ``ModelledClock``, ``MeasuredClock``, ``make_clock``)
            that ``step()`` tells where each step begins (``begin_step()``) and ends
            (``end_step(scheduler_output)``). Arrival, scheduling, token and finish times all come from it.
        runner: a model-free stand-in for the ``ModelRunner`` (``minengine.fleet.TokenFreeRunner``): the engine
            then loads no weights, no tokenizer and no torch, and takes the model's sizes from
            ``runner.model_config`` (``vocab_size``, ``max_position_embeddings``, ``eos_token_id``) and
            ``runner.kv_bytes_per_block(block_size)``. Scheduling, metrics and traces are unchanged: this is how
            the fleet simulator runs the engine's own scheduler on a modelled clock. ``None``: load
            ``config.model``.

    Raises:
        ValueError: bad settings, or settings that do not fit the model (``max_model_len``, KV pool).
    """

    def __init__(self, config: EngineConfig, clock: Clock | Callable[[], float] = time.perf_counter,
                 runner=None):
        self.config = config
        self.clock = as_clock(clock)
        self._in_flight: deque[_PendingStep] = deque()  # async scheduling: steps submitted, not yet processed
        if runner is None:
            device, bytes_per_block = self._load_model(config)
        else:  # model-free: nothing to load, no KV tensors to allocate
            device, bytes_per_block = None, runner.kv_bytes_per_block(config.block_size)
            self.model, self.hf_config, self.model_path, self.tokenizer = None, runner.model_config, None, None
        config.check_against_model(self.hf_config.max_position_embeddings)
        self.eos_token_id = self._eos_token_id()

        if config.num_kv_blocks is not None:
            num_blocks = config.num_kv_blocks
        elif config.kv_cache_memory_bytes is not None:
            num_blocks = config.kv_cache_memory_bytes // bytes_per_block
            if num_blocks < 1:
                raise ValueError(f"kv_cache_memory_bytes ({config.kv_cache_memory_bytes}) is smaller than one "
                                 f"KV block ({bytes_per_block} bytes)")
        else:
            num_blocks = min(DEFAULT_MAX_KV_BLOCKS,
                             config.max_num_seqs * cdiv(config.max_model_len, config.block_size))
            if config.gpu_memory_utilization is not None and device is not None:  # vLLM's knob: of free memory
                available = _available_bytes(device)
                if available is not None:
                    num_blocks = min(num_blocks, int(config.gpu_memory_utilization * available) // bytes_per_block)
                if num_blocks < 1:
                    raise ValueError(f"gpu_memory_utilization ({config.gpu_memory_utilization}) of the free "
                                     f"{device} memory is smaller than one KV block ({bytes_per_block} bytes)")
        self.num_kv_blocks = num_blocks
        # Every rank holds its heads' slice of every block: bytes_per_block is one rank's; the total is all ranks'.
        self.kv_cache_bytes = num_blocks * bytes_per_block * config.tensor_parallel_size
        swap_blocks = 0
        if config.preemption_mode == "swap":
            swap_blocks = num_blocks if config.swap_space_blocks is None else config.swap_space_blocks
            if config.swap_space_blocks is None and config.swap_space_bytes is not None:
                swap_blocks = config.swap_space_bytes // bytes_per_block
        if device is not None:  # CPU ranks share the host's memory; each GPU rank has its own
            ranks_per_device = config.tensor_parallel_size if device == "cpu" else 1
            _check_memory(num_blocks * bytes_per_block * ranks_per_device, device,
                          "num_kv_blocks / kv_cache_memory_bytes")
            _check_memory(swap_blocks * bytes_per_block * config.tensor_parallel_size, "cpu", "swap_space_blocks")

        self.kv_cache_manager = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.num_swap_blocks = swap_blocks
        settings = PolicySettings(prefill_decode_ratio=config.prefill_decode_ratio,
                                  splitfuse_target_tokens=config.splitfuse_target_tokens,
                                  priority_aging_steps=config.priority_aging_steps,
                                  predicted_length_aging_steps=config.predicted_length_aging_steps)
        self.scheduler = Scheduler(self.kv_cache_manager, config.max_num_batched_tokens, config.max_num_seqs,
                                   config.max_model_len, config.enable_chunked_prefill,
                                   config.long_prefill_token_threshold, policy=config.scheduling_policy,
                                   policy_settings=settings, preemption_mode=config.preemption_mode,
                                   swap_space_blocks=swap_blocks, shrink_prefill_chunks=config.shrink_prefill_chunks,
                                   speculative_config=config.speculative_config,
                                   predictor=config.output_length_predictor,
                                   reserve_predicted_kv=config.reserve_predicted_kv,
                                   async_scheduling=config.async_scheduling and runner is None)
        if runner is None:  # the model in this process ("uni") or in worker processes ("mp": minengine.executor)
            from minengine.executor import make_executor

            runner = make_executor(config, self.model, self.hf_config, self.model_path, device, num_blocks,
                                   swap_blocks, self._worker_threads(config), self._kv_cache_dtype,
                                   logits_processors=self._custom_logits_processors(config))
        self.runner = runner
        self._async = self.scheduler.async_scheduling
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self.request_metrics: dict[str, RequestMetrics] = {}
        self._past_metrics: list[RequestMetrics] = []  # finished requests whose id was used again
        self._undelivered: list[tuple[Request, str]] = []  # finished (timed out) in a step that raised
        self.num_bookkeeping_errors = 0  # traces / statistics / final texts that failed after a step committed
        self.traces: list[StepTrace] = []
        self.num_steps = 0  # steps recorded so far (the next trace's ``step``), kept when old traces are dropped
        self.input_processor = InputProcessor(config, self.tokenizer, self.hf_config.vocab_size, self.eos_token_id,
                                              num_blocks, self.clock, self._request_id_in_use,
                                              getattr(runner, "logits_processors", None))
        self.output_processor = OutputProcessor(self.tokenizer)
        self.log_stats = not config.disable_log_stats
        self.stat_logger = PrometheusStatLogger(
            config.served_model_name, config.max_model_len,
            {"block_size": str(config.block_size), "num_gpu_blocks": str(num_blocks),
             "num_cpu_blocks": str(swap_blocks), "enable_prefix_caching": str(config.enable_prefix_caching),
             "cache_dtype": config.dtype if config.kv_cache_dtype == "auto" else config.kv_cache_dtype},
            num_speculative_tokens=config.speculative_config.num_speculative_tokens if config.speculative_config else 0)
        self._record_state()

    def _custom_logits_processors(self, config: EngineConfig):
        """The engine's ``CustomLogitsProcessors`` (None without ``logits_processors``)."""
        if not config.logits_processors:
            return None
        import torch

        from minengine.config import VllmConfig
        from minengine.worker.logits_processors import CustomLogitsProcessors, load_logits_processors

        return CustomLogitsProcessors(load_logits_processors(config.logits_processors),
                                      VllmConfig(config, self.hf_config.vocab_size), torch.device("cpu"))

    def _load_model(self, config: EngineConfig) -> tuple[str, int]:
        """Load the model and tokenizer of ``config``; returns (resolved device, KV bytes per block of one rank).

        With worker processes (``minengine.executor``, "mp") only the config is read here (and checked against
        ``tensor_parallel_size``): each worker loads its own shard, and ``self.model`` is None."""
        import torch

        from minengine.executor import executor_backend
        from minengine.layers.kv_quant import kv_cache_torch_dtype
        from minengine.models.loader import load_model, load_tokenizer
        from minengine.worker.model_runner import kv_bytes_per_block

        dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[config.dtype]
        device = config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device")
        if device == "cpu" and config.num_cpu_threads is not None:
            torch.set_num_threads(config.num_cpu_threads)  # process-wide; see EngineConfig.num_cpu_threads
        self._kv_cache_dtype = kv_cache_torch_dtype(config.kv_cache_dtype, dtype)  # fp8: 1 byte per element
        if executor_backend(config) == "mp":
            return device, self._read_model_config(config, device, self._kv_cache_dtype)
        self.model, self.hf_config, self.model_path = load_model(config.model, dtype, device, config.revision,
                                                                 config.trust_remote_code, config.quantization)
        self.tokenizer = load_tokenizer(config.tokenizer or self.model_path, required=config.tokenizer is not None,
                                        revision=config.revision if config.tokenizer else None,
                                        trust_remote_code=config.trust_remote_code)
        return device, kv_bytes_per_block(self.model, config.block_size, self._kv_cache_dtype)

    def _read_model_config(self, config: EngineConfig, device: str, kv_cache_dtype) -> int:
        """The driver's side of worker processes: the checkpoint's config and tokenizer, no weights; returns the
        KV bytes per block of one rank (its KV heads: ``distributed.kv_heads_of_rank``)."""
        from minengine.distributed import check_tensor_parallel_size, kv_heads_of_rank
        from minengine.models.llama import _head_dim
        from minengine.models.loader import check_model_config, load_config, load_tokenizer, resolve_model_path

        self.model_path = resolve_model_path(config.model, config.revision)
        self.hf_config = load_config(self.model_path, config.trust_remote_code)
        check_model_config(self.hf_config, self.model_path)
        tp = config.tensor_parallel_size
        check_tensor_parallel_size(tp, self.hf_config, device, config.allow_cpu_oversubscription)
        self.model = None
        self.tokenizer = load_tokenizer(config.tokenizer or self.model_path, required=config.tokenizer is not None,
                                        revision=config.revision if config.tokenizer else None,
                                        trust_remote_code=config.trust_remote_code)
        cfg = self.hf_config
        _, kv_heads = kv_heads_of_rank(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads, tp, 0)
        return 2 * cfg.num_hidden_layers * config.block_size * kv_heads * _head_dim(cfg) * kv_cache_dtype.itemsize

    @staticmethod
    def _worker_threads(config: EngineConfig) -> int:
        """torch threads of each worker process: ``num_cpu_threads``, or the cores shared out when None."""
        from minengine.distributed import available_cpu_cores

        if config.num_cpu_threads is not None:
            return config.num_cpu_threads
        return max(1, available_cpu_cores() // config.tensor_parallel_size)

    def shutdown(self) -> None:
        """Stop the worker processes, if any (``minengine.executor``; also done when the engine is garbage
        collected and at interpreter exit). The engine runs no step afterwards. Idempotent."""
        self._in_flight.clear()
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

    def _eos_token_id(self) -> int | None:
        eos = getattr(self.hf_config, "eos_token_id", None)
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        return eos

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
            self._detok[child.request_id] = IncrementalDetokenizer.for_request(self.tokenizer, child)
            self.request_metrics[child.request_id] = RequestMetrics(arrival_time=child.arrival_time,
                                                                    num_prompt_tokens=child.num_prompt_tokens)
            if group.is_parent and parent is None:
                parent = ParentRequest(group.request_id, group.params.n, group.params.output_kind, child,
                                       self.request_metrics[child.request_id])
            self.output_processor.add_request(child, index, parent)
        if self.log_stats:
            self.stat_logger.record_new_request(group.params.n, [r.request_id for r in group.requests])
            self._record_state(self.stat_logger.last_cached_free_blocks)  # queueing frees no block

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Finish requests with reason "abort" in whatever state they are, freeing their blocks (an ``n > 1``
        parent id aborts all its children). Unknown and already finished ids are ignored (as in vLLM)."""
        if not isinstance(request_id, (str, Iterable)):
            raise VLLMValidationError(f"request_id must be a string or an iterable of strings, got {show(request_id)}")
        ids = [request_id] if isinstance(request_id, str) else list(request_id)  # a generator is read once
        if not all(isinstance(i, str) for i in ids):
            raise VLLMValidationError(f"request_id must be a string or an iterable of strings, got {show(ids)}")
        ids = [child for rid in ids for child in self.output_processor.children_of(rid)]
        now = self.clock()
        aborted = self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
        for request in aborted:
            self._finish_metrics(request, now)
            del self._detok[request.request_id]
        self.output_processor.abort([r.request_id for r in aborted])
        if self.log_stats:
            self._record_finished(aborted)
            self._record_state()

    def has_unfinished_requests(self) -> bool:
        """Unfinished requests, or (async scheduling) a step still in flight, whose output ``step()`` takes."""
        return self.scheduler.has_unfinished_requests() or bool(self._in_flight)

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.requests)

    # ---- one step -------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, sample, update; returns an output for every request that got a token
        or finished in this step (cumulative, delta or final-only as its ``output_kind``; one per parent of
        ``n > 1`` children).

        A step is a transaction. If the forward, the sampler, the detokenizer or the logprobs raise (or Ctrl-C
        arrives there), the scheduler rolls the step back (``Scheduler.rollback``): the engine is as if the step
        had not been scheduled (its preemptions stand, and are recorded in a ``rolled_back`` trace), no block it
        would have written is in the prefix cache, and the exception propagates: as a ``RequestError`` naming
        the requests when the failure was one request's (its detokenizing, its logprobs), else as it was. The
        next ``step()`` serves the same requests again, or the caller aborts them (all, or the ones named);
        outputs a failed step already owed (requests past their deadline) come with the next step.

        Once the step commits (``update_from_output``) nothing raises: a statistic or trace that fails to record
        is logged and counted in ``num_bookkeeping_errors``, so a step's outputs are never lost.

        Raises:
            RequestError: the step failed because of the requests in its ``request_ids`` (rolled back).
            RuntimeError: if unfinished requests exist but none could be scheduled (a bug guard: admission
                checks make this impossible, and it is better to fail than to spin).
        """
        if self._async:
            return self._step_async()
        self.clock.begin_step()
        start = self.clock()
        self._undelivered += self._finish_timed_out(start)
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return self._idle_step(sched)
        pending = self._pending_step(sched, start)
        try:  # everything that may fail, before anything is committed
            sampled = self.runner.execute(sched)
            kept, detoks = self._detokenize(sched, sampled)
            logprobs = self._prepare_logprobs(pending, kept)
        except BaseException:
            self.scheduler.rollback(sched)
            self.clock.end_step(SchedulerOutput())  # the step did not happen: it costs no modelled time
            self._record_rolled_back(sched, start)
            raise
        return self._finish_step(pending, start, sampled, kept, detoks, logprobs)

    def _step_async(self) -> list[RequestOutput]:
        """``step()`` with async scheduling (vLLM's ``async_scheduling``, its batch queue of two steps): schedule
        and submit step N+1 to the workers (its decodes' tokens of step N are placeholders, filled in by the
        workers), then wait for step N and process its output, so the scheduling of N+1 and the processing of N
        run while the workers compute. The first call of a run only submits (returns no tokens); the engine
        has unfinished work while a step is in flight.

        A failure while processing a step (the workers, the detokenizer, Ctrl-C) lets the workers finish the
        step still in flight (its tokens dropped), then rolls both back, newest first (``Scheduler.rollback``):
        the engine is as if neither had been scheduled, as in ``step()``. A worker failure leaves the executor
        stopped: every later step raises ``WorkerFailedError``."""
        self.clock.begin_step()
        start = self.clock()
        self._undelivered += self._finish_timed_out(start)
        sched = self.scheduler.schedule()  # at most one step is in flight here
        submitted = sched.has_work  # a step may only swap out a request (its blocks were held by the step in flight)
        if submitted:
            pending = self._pending_step(sched, start)
            try:
                self.runner.submit(sched)
            except BaseException:
                self.scheduler.rollback(sched)
                self.clock.end_step(SchedulerOutput())
                raise
            self._in_flight.append(pending)
        if not self._in_flight:
            return self._idle_step(sched)
        if submitted and len(self._in_flight) == 1:  # nothing older to wait for: let it run
            self.clock.end_step(SchedulerOutput())
            return self._deliver_timed_out()
        pending = self._in_flight.popleft()
        try:
            sampled = self.runner.collect()  # the oldest step: it was submitted first
            kept, detoks = self._detokenize(pending.sched, sampled, pending.requests)
            logprobs = self._prepare_logprobs(pending, kept)
        except BaseException:
            self._abandon_in_flight(pending, start)
            self.clock.end_step(SchedulerOutput())
            raise
        return self._finish_step(pending, start, sampled, kept, detoks, logprobs)

    def _abandon_in_flight(self, failed: _PendingStep, start: float) -> None:
        """Async scheduling: processing ``failed`` raised. Drain the steps submitted after it (so the workers
        are idle and run nothing stale), then roll back every open step, newest first (each recorded as a
        ``rolled_back`` trace, so its preemptions count everywhere, as in ``step()``)."""
        later = list(self._in_flight)
        self._in_flight.clear()
        if getattr(self.runner, "is_alive", False):
            for _ in later:
                try:
                    self.runner.collect()
                except Exception:  # the executor stopped meanwhile: nothing more to drain
                    break
        for pending in reversed([failed] + later):
            self.scheduler.rollback(pending.sched)
        for pending in [failed] + later:
            self._record_rolled_back(pending.sched, start)

    def _pending_step(self, sched: SchedulerOutput, start: float) -> _PendingStep:
        """What the trace of a scheduled step needs from the moment it was scheduled."""
        for rid in sched.preempted_ids:  # preemptions stand even if the step fails
            self.request_metrics[rid].num_preemptions += 1
        requests = None
        if self._async:  # a request may finish (and its id be reused) while its step is in flight
            requests = {s.request_id: self.scheduler.requests[s.request_id] for s in sched.scheduled}
            for rid in sched.admitted_ids:
                m = self.request_metrics[rid]
                if m.first_scheduled_time is None:
                    m.first_scheduled_time = start
        return _PendingStep(sched, start, self._block_snapshot() if self.config.trace_block_tables else {},
                            self.kv_cache_manager.num_free_blocks, self.kv_cache_manager.pool.num_cached_free_blocks,
                            requests)

    def _idle_step(self, sched: SchedulerOutput) -> list[RequestOutput]:
        """Nothing scheduled and nothing in flight: only the outputs of requests past their deadline."""
        self.clock.end_step(sched)
        if self.has_unfinished_requests():
            raise RuntimeError("no request could be scheduled although some are unfinished")
        return self._deliver_timed_out()

    def _deliver_timed_out(self) -> list[RequestOutput]:
        timed_out = self._take_undelivered()
        self._record_stats(None, [], [r for r, _ in timed_out])
        return self.output_processor.make_outputs(timed_out, self.request_metrics)

    def _prepare_logprobs(self, pending: _PendingStep, kept: dict) -> dict:
        """The step's logprobs as positions (``OutputProcessor.prepare_logprobs``), before anything is committed:
        only the tokens kept (a stop may end a run of accepted proposals) and, with async scheduling, not those of
        requests that finished while the step ran.

        Raises:
            RequestError: building one request's positions failed; names it (the step is rolled back).
        """
        sched = pending.sched
        logprobs, prompt_logprobs = self.runner.last_logprobs, self.runner.last_prompt_logprobs
        if logprobs and sched.num_spec_tokens:
            logprobs = {rid: lps[:len(kept[rid])] for rid, lps in logprobs.items() if rid in kept}
        if pending.requests is not None:
            logprobs = {rid: lps for rid, lps in logprobs.items() if rid in kept}
            prompt_logprobs = {rid: lps for rid, lps in prompt_logprobs.items()
                               if self.scheduler.requests.get(rid) is pending.requests[rid]}
        return self.output_processor.prepare_logprobs(logprobs, prompt_logprobs)

    def _finish_step(self, pending: _PendingStep, start: float, sampled: dict[str, list[int]], kept: dict,
                     detoks: dict, logprobs: dict) -> list[RequestOutput]:
        """Commit a step that ran (``update_from_output``), then metrics, outputs and its ``StepTrace``. Nothing
        here may raise, or the step's outputs would be lost: the trace and statistics are guarded."""
        sched = pending.sched
        self.output_processor.record_logprobs(logprobs)
        got_token, finished = self.scheduler.update_from_output(sched, kept)
        self.clock.end_step(sched)  # a modelled clock advances by this step's cost here
        now = self.clock()

        for rid in sched.admitted_ids if pending.requests is None else ():  # async: set when scheduled
            m = self.request_metrics[rid]
            if m.first_scheduled_time is None:
                m.first_scheduled_time = start
        outputs_for = dict.fromkeys(r.request_id for r in got_token)
        for request in got_token:
            m = self.request_metrics[request.request_id]
            if m.first_token_time is None:
                m.first_token_time = now
                m.num_cached_tokens = request.num_cached_tokens
            else:
                m.itls.append(now - request.token_times[-1])
            request.token_times.append(now)
            for _ in range(len(kept[request.request_id]) - 1):  # accepted proposals: arrive together, gap 0
                m.itls.append(0.0)
                request.token_times.append(now)
            m.num_output_tokens = request.num_output_tokens
            detok = self._detok[request.request_id] = detoks[request.request_id]
            if detok.stop_reason is not None:
                # A stop string wins over "length" when the last allowed token completes it (as vLLM).
                request.stop_reason = detok.stop_reason
                if request.is_finished:
                    request.status = RequestStatus.FINISHED_STOPPED
                else:
                    finished.extend(self.scheduler.finish_requests([request.request_id],
                                                                   RequestStatus.FINISHED_STOPPED))
        for request in finished:
            self._finish_metrics(request, now)
            outputs_for[request.request_id] = None
        requests = {r.request_id: r for r in got_token + finished}
        timed_out = self._take_undelivered()
        outputs = self.output_processor.make_outputs(
            timed_out + [(requests[rid], self._text(rid, requests[rid].is_finished)) for rid in outputs_for],
            self.request_metrics)
        for request in finished:
            del self._detok[request.request_id]
        try:
            self._record_step(pending, start, now, sampled, kept, got_token, finished, timed_out)
        except Exception:  # an observer failed: the step stands and its outputs go out
            self.num_bookkeeping_errors += 1
            logger.exception("step %d committed, but recording its trace or statistics failed", self.num_steps)
        return outputs

    def _record_step(self, pending: _PendingStep, start: float, now: float, sampled: dict, kept: dict,
                     got_token: list[Request], finished: list[Request], timed_out: list[tuple[Request, str]]) -> None:
        """The committed step's ``StepTrace`` and Prometheus series."""
        sched = pending.sched
        timed_out_ids = [r.request_id for r, _ in timed_out]
        self.traces.append(StepTrace(
            step=self.num_steps, start_time=start, end_time=now, token_budget=self.config.max_num_batched_tokens,
            chunks=[ScheduledChunk(s.request_id, s.num_new_tokens, s.start_pos, s.is_prefill, s.sample)
                    if not s.spec_token_ids else
                    ScheduledChunk(s.request_id, s.num_new_tokens, s.start_pos, s.is_prefill, s.sample,
                                   s.num_spec_tokens, len(sampled[s.request_id]) - 1)
                    for s in sched.scheduled],
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            num_free_blocks=pending.num_free_blocks, num_cached_free_blocks=pending.num_cached_free_blocks,
            num_total_blocks=self.num_kv_blocks,
            preempted_ids=sched.preempted_ids, admitted_ids=sched.admitted_ids,
            finished_ids=timed_out_ids + [r.request_id for r in finished],
            prefix_queried_tokens=sched.prefix_queried_tokens, prefix_hit_tokens=sched.prefix_hit_tokens,
            readmission_hit_tokens=sched.readmission_hit_tokens,
            num_swapped_out_blocks=len(sched.blocks_to_swap_out), num_swapped_in_blocks=len(sched.blocks_to_swap_in),
            swap_time_s=self.runner.last_swap_time_s, timed_out_ids=timed_out_ids,
            **pending.trace_blocks,
        ))
        self.num_steps += 1
        self._record_stats(self.traces[-1], got_token, [r for r, _ in timed_out] + finished,
                           {rid: len(tokens) for rid, tokens in kept.items()} if sched.num_spec_tokens else None)

    def _record_rolled_back(self, sched: SchedulerOutput, start: float) -> None:
        """The trace of a step that was rolled back: no chunk ran, but the preemptions made while scheduling it
        stand (the victims' blocks are gone), so they are counted like any other (trace, summary, Prometheus).
        Never raises: the step's own error is what the caller must see."""
        try:
            kv = self.kv_cache_manager
            self.traces.append(StepTrace(
                step=self.num_steps, start_time=start, end_time=self.clock(),
                token_budget=self.config.max_num_batched_tokens, chunks=[], num_running=self.scheduler.num_running,
                num_waiting=self.scheduler.num_waiting, num_free_blocks=kv.num_free_blocks,
                num_cached_free_blocks=kv.pool.num_cached_free_blocks, num_total_blocks=self.num_kv_blocks,
                preempted_ids=list(sched.preempted_ids), admitted_ids=[], finished_ids=[], prefix_queried_tokens=0,
                prefix_hit_tokens=0, rolled_back=True,
                **(self._block_snapshot() if self.config.trace_block_tables else {})))
            self.num_steps += 1
            if self.log_stats:
                self.stat_logger.record_step(self.traces[-1], [], self.request_metrics)
        except Exception:
            self.num_bookkeeping_errors += 1
            logger.exception("recording the rolled-back step %d failed", self.num_steps)

    def _text(self, request_id: str, finished: bool) -> str:
        """The request's text for its output; if the final full decode fails, the text streamed so far (logged:
        the tokens are right, only a held-back partial character may be missing)."""
        detok = self._detok[request_id]
        try:
            return detok.text(finished)
        except Exception:
            self.num_bookkeeping_errors += 1
            logger.exception("request %r: decoding its final text failed; sending the text so far", request_id)
            return detok.output_text

    def _detokenize(self, sched: SchedulerOutput, sampled: dict[str, list[int]],
                    requests: dict[str, Request] | None = None) -> tuple[dict, dict]:
        """The tokens each sampling request keeps and its detokenizer after them (new objects: nothing is
        committed here). A request keeps its tokens up to the first stop (length, EOS, stop token ids: the
        scheduler's rules) and up to the token that completes a stop string: with speculative decoding a
        step may bring several tokens, and none after a stop may reach the output. ``requests`` (async
        scheduling: the step's requests when it was scheduled): those finished since get nothing."""
        kept, detoks = {}, {}
        live = self.scheduler.requests
        for s in sched.scheduled:
            if not s.sample:
                continue
            rid = s.request_id
            if requests is not None and live.get(rid) is not requests[rid]:
                continue
            tokens, detok = sampled[rid], self._detok[rid]
            try:
                if len(tokens) == 1:
                    kept[rid], detoks[rid] = tokens, detok.advanced(tokens[0])
                    continue
                tokens = tokens[:self.scheduler.num_tokens_before_stop(self.scheduler.requests[rid], tokens)]
                for i, token in enumerate(tokens):
                    detok = detok.advanced(token)
                    if detok.stop_reason is not None:
                        tokens = tokens[:i + 1]
                        break
            except Exception as exc:  # this request's text failed: the others are not to blame
                raise RequestError([self.output_processor.caller_id(rid)],
                                   f"detokenizing request {rid!r} failed: {exc!r}") from exc
            kept[rid], detoks[rid] = tokens, detok
        return kept, detoks

    def _take_undelivered(self) -> list[tuple[Request, str]]:
        done, self._undelivered = self._undelivered, []
        return done

    def _finish_timed_out(self, now: float) -> list[tuple[Request, str]]:
        """Finish every unfinished request whose deadline has passed with reason "timeout" (its blocks and
        swap blocks are freed); returns them with their final text."""
        expired = self.scheduler.past_deadline(now)
        done = []
        for request in self.scheduler.finish_requests(expired, RequestStatus.FINISHED_TIMEOUT):
            self._finish_metrics(request, now)
            done.append((request, self._text(request.request_id, True)))
            del self._detok[request.request_id]
        return done

    def _record_stats(self, trace: StepTrace | None, got_token: list[Request], finished: list[Request],
                      num_new_tokens: dict[str, int] | None = None) -> None:
        """Update the Prometheus series after a step (not with ``disable_log_stats``; ``num_new_tokens``: tokens
        per request when a request got more than one, with speculative decoding)."""
        if not self.log_stats:
            return
        self.stat_logger.record_step(trace, got_token, self.request_metrics, num_new_tokens)
        self._record_finished(finished)
        # Without finished requests no block was freed after scheduling: the trace's count is still exact.
        self._record_state(trace.num_cached_free_blocks if trace is not None and not finished else None)

    def _record_finished(self, finished: list[Request]) -> None:
        """The Prometheus series of finished requests, one at a time: one request's statistics failing is logged
        and counted (``num_bookkeeping_errors``) and costs neither the others theirs nor anyone an output."""
        for r in finished:
            try:
                self.stat_logger.record_finished(
                    [(self.request_metrics[r.request_id], r.sampling_params.max_tokens, r.request_id)])
            except Exception:
                self.num_bookkeeping_errors += 1
                logger.exception("request %r: recording its statistics failed", r.request_id)

    def _record_state(self, num_cached_free_blocks: int | None = None) -> None:
        """Queue and pool gauges. ``num_cached_free_blocks`` saves a scan of the free queue when the caller
        knows it (None: count now)."""
        if not self.log_stats:
            return
        s, kv = self.scheduler, self.kv_cache_manager
        if num_cached_free_blocks is None:
            num_cached_free_blocks = kv.pool.num_cached_free_blocks
        self.stat_logger.record_state(s.num_running, s.num_waiting, s.num_swapped,
                                      kv.num_free_blocks, num_cached_free_blocks, self.num_kv_blocks)

    def _block_snapshot(self) -> dict:
        pool = self.kv_cache_manager.pool
        return {
            "block_tables": {r.request_id: self.kv_cache_manager.get_block_ids(r.request_id)
                             for r in self.scheduler.running},
            "block_ref_counts": pool.ref_counts(),
            "cached_block_ids": [b.block_id for b in pool.blocks if b.block_hash is not None],
        }

    def _finish_metrics(self, request: Request, now: float) -> None:
        m = self.request_metrics[request.request_id]
        m.finished_time = now
        m.num_output_tokens = request.num_output_tokens
        m.num_preemptions = request.num_preemptions
        m.finish_reason = request.status.finish_reason

    # ---- statistics -----------------------------------------------------------------------------------
    def summary(self) -> ServingSummary:
        """TTFT/TPOT/ITL percentiles, throughput, preemptions, prefix hits and peak KV use of all requests
        finished so far, over all recorded steps."""
        return summarize(self._past_metrics + list(self.request_metrics.values()), self.traces, self.num_kv_blocks)

    def reset_stats(self) -> None:
        """Forget finished requests' metrics and the step trace (e.g. between benchmark runs)."""
        live = set(self.scheduler.requests)
        self.request_metrics = {k: v for k, v in self.request_metrics.items() if k in live}
        self._past_metrics = []
        self.traces = []
        self.num_steps = 0

    def get_metrics(self) -> list[Metric]:
        """vLLM's ``LLMEngine.get_metrics()``: a snapshot of the Prometheus series (``minengine.metrics.reader``
        Counter / Gauge / Histogram objects, vLLM's names; the totals count since the engine started).

        Raises:
            RuntimeError: the engine runs with ``disable_log_stats`` (as vLLM: the series are not kept).
        """
        if not self.log_stats:
            raise RuntimeError("stat logging is disabled (EngineConfig.disable_log_stats=True)")
        with self.stat_logger.lock:  # one consistent snapshot, as /metrics renders it
            return get_metrics_snapshot(self.stat_logger.registry)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix (vLLM's ``reset_prefix_cache``). Only when no request holds a block
        (the prefix cache of running requests is in use): returns False and changes nothing otherwise. With
        ``reset_running_requests`` (vLLM's) the running requests are first preempted by recompute
        (``Scheduler.preempt_running_by_recompute``), so the reset always happens; they go on from where they
        were, recomputing their KV."""
        if reset_running_requests:
            n = self.scheduler.preempt_running_by_recompute()
            if self.log_stats:
                self.stat_logger.preemptions.inc(n)
        if self.kv_cache_manager.num_used_blocks:
            return False
        self.kv_cache_manager.pool.reset_prefix_cache()
        self._record_state()
        return True

"""EngineConfig: every knob of the engine, validated, with vLLM's names."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from minengine.core.policies import POLICIES
from minengine.core.predictors import OutputLengthPredictor
from minengine.core.scheduler_config import PREEMPTION_MODES
from minengine.core.spec_decode import SpeculativeConfig
from minengine.exceptions import VLLMValidationError, show
from minengine.sampling_params import MAX_LOGPROBS

BUNDLED_MODEL = str(Path(__file__).resolve().parent / "assets" / "tiny-shakespeare-llama")

_DTYPES = ("float32", "float16", "bfloat16")
# vLLM's names. "fp8" and "fp8_e4m3": float8 e4m3 K/V with per-tensor scales (minengine/layers/kv_quant.py).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
# vLLM's --attention-backend; minengine/layers/attention.py has each one
ATTENTION_BACKENDS = ("auto", "reference", "cpu", "triton")
# None = the checkpoint's weights as they are; "int8": weight-only int8 of the linear layers (layers/quantization.py);
# "experts_int8": vLLM's name for the same per-output-channel int8 weights, taken as "int8" (see that module).
QUANTIZATIONS = (None, "int8", "experts_int8")
MAX_BLOCK_SIZE = 1024  # tokens; vLLM offers 1..128
# Every count setting (tokens, blocks, sequences, steps) fits in an int32: the forward batch holds token counts in
# int32 tensors (query_start_loc, seq_lens), and no machine holds 2**31 of any of them.
MAX_COUNT = 2**31 - 1
MAX_BYTES = 2**63 - 1  # byte sizes fit in an int64
MAX_SEED = 2**64 - 1  # what torch.Generator.manual_seed takes
# Keys ``EngineConfig.extra`` accepts: none yet (a misspelt setting there would otherwise be ignored silently).
EXTRA_KEYS: frozenset[str] = frozenset()


STRUCTURED_OUTPUT_BACKENDS = ("auto", "xgrammar", "guidance")
# The history a served engine keeps (step traces, finished requests' metrics), in bytes as
# ``metrics.history.entry_bytes`` counts them.
DEFAULT_MAX_HISTORY_BYTES = 64 * 2**20


@dataclass
class StructuredOutputsConfig:
    """The engine's structured-outputs settings (vLLM's ``StructuredOutputsConfig``; ``--structured-outputs-config``
    takes them as JSON).

    Attributes:
        backend: ``"auto"`` (vLLM's default: xgrammar, unless the constraint has what xgrammar would not enforce
            or cannot compile; then llguidance), ``"xgrammar"`` or ``"guidance"`` (llguidance) only.
        disable_any_whitespace: every request's JSON is compact (no free whitespace), as if each request set
            ``structured_outputs.disable_any_whitespace``.
        disable_additional_properties: every request's JSON-schema objects take only their listed properties.

    Raises:
        VLLMValidationError: naming ``structured_outputs_config.<field>``: an unknown backend or key, a non-bool.
    """

    backend: str = "auto"
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False

    def __post_init__(self) -> None:
        if self.backend not in STRUCTURED_OUTPUT_BACKENDS:
            _invalid("structured_outputs_config.backend", f"structured_outputs_config.backend must be one of "
                     f"{STRUCTURED_OUTPUT_BACKENDS}, got {show(self.backend)}")
        for name in ("disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                _invalid(f"structured_outputs_config.{name}", f"structured_outputs_config.{name} must be a bool, "
                         f"got {show(getattr(self, name))}")

    @classmethod
    def from_any(cls, value) -> StructuredOutputsConfig:
        """From itself, a dict with vLLM's keys, or None (the defaults)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            _invalid("structured_outputs_config", f"structured_outputs_config must be an object, got {show(value)}")
        unknown = sorted(set(value) - {"backend", "disable_any_whitespace", "disable_additional_properties"})
        if unknown:
            _invalid("structured_outputs_config", f"structured_outputs_config has unknown keys {unknown} (known: "
                     "backend, disable_any_whitespace, disable_additional_properties)")
        return cls(**value)


def _invalid(parameter: str, message: str):
    raise VLLMValidationError(message, parameter=parameter)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(name: str, value: int, high: int = MAX_COUNT) -> None:
    if not _is_int(value) or not 1 <= value <= high:
        _invalid(name, f"{name} must be an integer in [1, {high}], got {show(value)}")


def _count(name: str, value: int) -> None:
    """``value`` must be an integer in [0, MAX_COUNT]."""
    if not _is_int(value) or not 0 <= value <= MAX_COUNT:
        _invalid(name, f"{name} must be an integer in [0, {MAX_COUNT}], got {show(value)}")


def available_cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one, else all of them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


@dataclass
class EngineConfig:
    """All settings of one engine; names and meanings follow vLLM's ``EngineArgs``.

    Attributes:
        model: Hugging Face model directory or hub id; ``None`` means the bundled tiny Shakespeare model.
        tokenizer: tokenizer directory or hub id; ``None`` means the model's own (if it has tokenizer files).
        dtype: ``"float32"`` (default, exact against transformers on CPU), ``"float16"`` or ``"bfloat16"``.
        device: ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when present).
        block_size: tokens per KV block (vLLM default 16).
        num_kv_blocks: number of KV blocks in the pool; ``None`` derives it from ``kv_cache_memory_bytes``
            or, if that is also ``None``, makes room for ``max_num_seqs`` sequences of ``max_model_len``
            tokens, capped at 2048 blocks.
        kv_cache_memory_bytes: KV memory budget in bytes, instead of ``num_kv_blocks`` (give one or the other).
        max_num_batched_tokens: the token budget, the most tokens (prefill + decode) one step may compute.
        max_num_seqs: sequence slots, the most requests running at once.
        max_model_len: the most tokens (prompt + output) one request may hold; ``None`` takes the model's
            ``max_position_embeddings``.
        enable_chunked_prefill: split long prompts over several steps (Sarathi, Agrawal et al. 2023).
            When off, a prompt is prefilled in one step and must fit in the token budget.
        long_prefill_token_threshold: the largest prefill chunk one request may take in one step
            (0 = no limit beyond the token budget); needs ``enable_chunked_prefill``.
        enable_prefix_caching: reuse the KV of full blocks whose tokens (and all tokens before) match.
        preemption_mode: ``"recompute"``: a preempted request frees its blocks and is prefilled again;
            ``"swap"``: its KV blocks are copied to a CPU swap space and back when it resumes (vLLM v0), falling
            back to recompute when the swap space is full.
        swap_space_blocks: size of the CPU swap space in KV blocks (``"swap"`` mode); ``None`` = as many as
            the GPU pool (``num_kv_blocks``); 0 means every preemption falls back to recompute.
        scheduling_policy: how a step spends the token budget, a name in ``minengine.core.policies.POLICIES``:
            ``"decode-first"`` (default), ``"prefill-first"``, ``"balanced"``, ``"dynamic-splitfuse"``,
            ``"priority"``, ``"round-robin"``.
        prefill_decode_ratio: ``"balanced"``: prefill tokens : decode tokens of the budget (1.0 = an even
            split; 3.0 gives prefill 3/4). Either side's unused share goes to the other.
        splitfuse_target_tokens: ``"dynamic-splitfuse"``: the forward size (decode + prefill tokens) each step
            aims at; ``None`` = ``max_num_batched_tokens``. Must be <= ``max_num_batched_tokens``.
        priority_aging_steps: ``"priority"``: a request's priority value improves by 1 every this many steps
            since it arrived, so a low-priority request cannot starve forever; 0 disables aging.
        shrink_prefill_chunks: admission probe: when a new prefill chunk needs more KV blocks than are free,
            shrink it to what fits (down to one block) instead of leaving the request waiting.
        speculative_config: speculative decoding by prompt lookup, vLLM's dict: ``{"method": "ngram",
            "num_speculative_tokens": k, "prompt_lookup_max": 5, "prompt_lookup_min": 5}`` (or a
            ``minengine.core.spec_decode.SpeculativeConfig``); None = off. Greedy output is unchanged; see the
            README section "Speculative decoding".
        output_length_predictor: predictive scheduling: an ``OutputLengthPredictor``
            (``minengine.core.predictors``: oracle, noisy oracle, learned) that predicts each request's output
            length when it is added; ``None`` with ``"shortest-predicted-first"`` or ``reserve_predicted_kv``
            predicts ``max_tokens``. Not a command-line setting (it is an object).
        predicted_length_aging_steps: ``"shortest-predicted-first"``: a request's predicted remaining work
            counts one token less for every this many steps it has been in the system, so a long request
            cannot starve; 0 disables aging.
        reserve_predicted_kv: predicted-length-aware admission: admit a request only when the free KV blocks
            cover its prompt plus its predicted output, beyond what the running requests are predicted to
            still need (S3, Jin et al. 2023), so fewer requests are preempted; works with every policy.
        seed: seed for requests without their own ``SamplingParams.seed``.
        trace_block_tables: record each step's block tables and ref counts in the trace (for drawing).
        disable_log_stats: vLLM's knob: do not update the Prometheus series (``get_metrics``, the server's
            ``/metrics``) after every step; the per-request metrics, traces and ``summary()`` are unaffected. The
            fleet simulator sets it: a replica's millions of steps need no Prometheus counters.
        num_cpu_threads: torch intra-op threads on ``device="cpu"`` (``torch.set_num_threads``, process-wide);
            ``None`` leaves torch's setting alone. vLLM has no such field (its CPU backend binds threads with
            the ``VLLM_CPU_OMP_THREADS_BIND`` environment variable); the default 1 was measured: see
            ``benchmarks/cpu_threads.py`` and the README section "Time: modelled vs measured".
        gpu_memory_utilization: vLLM's knob, as a KV budget: at most this fraction of the free device (CUDA)
            or host (CPU) memory for the KV pool, when ``num_kv_blocks`` and ``kv_cache_memory_bytes`` are
            None; the pool is never larger than the default size. None = the default size.
        swap_space_bytes: ``"swap"``: the CPU swap space in bytes (vLLM's ``swap_space`` is GiB), when
            ``swap_space_blocks`` is None.
        revision: the hub revision (branch, tag or commit) of ``model`` and ``tokenizer``, for the loaders.
        trust_remote_code: let transformers run a checkpoint's own code (its config and tokenizer classes).
        kv_cache_dtype: vLLM's name: ``"auto"`` (the model's dtype) or ``"fp8"`` / ``"fp8_e4m3"``: K/V stored as
            float8 e4m3 with one scale per layer for K and one for V (1.0 unless set), dequantized inside attention;
            a KV block then takes 1 byte per element, so a memory budget (``kv_cache_memory_bytes``,
            ``gpu_memory_utilization``) holds 4x the float32 blocks. See ``minengine/layers/kv_quant.py``.
        quantization: ``None`` or ``"int8"``: weight-only int8 of every decoder linear layer (q/k/v/o,
            gate/up/down; per-output-channel scales, applied at load time; activations, embeddings and the LM head
            stay in ``dtype``). ``"experts_int8"``, vLLM's name for the same scheme (online, per-output-channel
            absmax / 127, W8A16), is accepted and stored as ``"int8"``. See ``minengine/layers/quantization.py``.
        attention_backend: vLLM's name (``--attention-backend``): which paged attention reads the KV cache,
            chosen once when the engine is built: ``"reference"`` (the Python paged read the course teaches,
            ``layers/reference_attention.py``), ``"cpu"`` (minengine's C++ kernel, ``layers/cpu_attention.py``; the
            reference runs while it builds), ``"triton"`` (the Triton kernel: CUDA, or the Triton interpreter) or
            ``"auto"``: "triton" on CUDA where Triton is installed, "cpu" on a CPU where the kernel takes the
            model, else "reference". The environment variable ``MINENGINE_CPU_KERNEL=0`` makes "auto" pick
            "reference". See ``minengine/layers/attention.py``.
        enforce_eager: vLLM's name: ``True`` runs every step eagerly; ``False`` compiles decode steps with
            ``torch.compile`` wherever that applies (a CPU with the C++ attention, a float32 / bfloat16 model and
            cache, no int8 weights, one process: ``worker/compiled_decode.py``); ``None`` (the default) runs eagerly
            too: unlike vLLM, compiling is asked for, since the first decode step pays the compile (minutes of
            CPU on a small machine) and its gain is not yet measured side by side. A compile that fails is logged
            once and the steps run eagerly.
        max_logprobs: vLLM's: the most ``logprobs`` / ``prompt_logprobs`` a request may ask for (20; -1 = no cap,
            the vocabulary size); more is a ``VLLMValidationError`` naming the field and the limit (a 400 from
            the server).
        served_model_name: the name clients and metrics use (``model`` of the OpenAI API, the ``model_name``
            label); None = ``model`` as given, or "tiny-shakespeare-llama" for the bundled model (``model`` None
            or ``BUNDLED_MODEL``).
        logits_processors: vLLM's custom logits processors: ``LogitsProcessor`` subclasses
            (``minengine.v1.sample.logits_processor``) or their ``"module:Class"`` names, built once per engine
            and applied to every step's batch (``worker/logits_processors.py``); not with ``speculative_config``
            (as vLLM). Not a command-line setting.
        tensor_parallel_size: vLLM's name: split the model over this many ranks, one worker process each
            (Megatron-style; README "Tensor parallelism"); on the CPU each rank needs its own core (see
            ``allow_cpu_oversubscription``), on CUDA its own GPU. The heads (and the MLP width) must divide by it.
        enable_expert_parallel: vLLM's name: with ``tensor_parallel_size`` N > 1 on a mixture-of-experts model,
            split its experts over the N ranks (rank r holds experts ``[r E/N, (r+1) E/N)``) and send each token to
            its experts' ranks and back by all-to-all (``layers/expert_parallel.py``); attention stays
            tensor-parallel. A MoE model at N > 1 needs it; a dense model, or E not divisible by N, is refused when
            the model is read. At N = 1 a MoE model runs as without it.
        distributed_executor_backend: vLLM's name: ``"mp"`` (worker processes, ``minengine.executor``) or
            ``"uni"`` (the model in this process; world size 1 without async scheduling); None = "uni" when
            ``tensor_parallel_size`` is 1 and ``async_scheduling`` off, else "mp". ``"external_launcher"``: this
            process is one rank of ``tensor_parallel_size``, started by ``torchrun`` or by hand, on this machine
            or another, joined through the ``MASTER_ADDR`` / ``MASTER_PORT`` / ``WORLD_SIZE`` / ``RANK``
            rendezvous (``distributed.init_env_group``); every rank runs the whole engine on its shard and must be
            given the same requests in the same order (offline use: ``LLM``, ``generate``, ``run``; not ``serve``).
        async_scheduling: vLLM's name: schedule step N+1 while the workers run step N (tokens of N are
            placeholders until its output arrives), so the host's scheduling hides behind the forward; needs
            worker processes ("mp"), not with ``speculative_config``. Outputs are the same as without it.
        allow_cpu_oversubscription: let ``tensor_parallel_size`` exceed the CPU cores this process may use
            (refused otherwise: a rank per core). For correctness tests (TP 4 on fewer cores); never fast.
        execute_model_timeout_s: the longest wait, in seconds, for the workers' answer to one step (vLLM's
            ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``); a worker that raises or dies is reported at once.
        structured_outputs_config: vLLM's: a ``StructuredOutputsConfig`` or its dict (``{"backend": "auto",
            "disable_any_whitespace": false, "disable_additional_properties": false}``); None = the defaults.
        max_history_bytes: the most bytes of history a served engine (``AsyncLLMEngine``, ``minengine serve``)
            keeps: its step traces and finished requests' metrics, oldest dropped first (``metrics/history.py``
            measures each entry: a step trace grows with the KV pool and the running requests' block tables, a
            finished request with its output tokens, one latency each; ``benchmarks/server_memory.py`` prints
            both). An offline ``LLM`` / ``LLMEngine`` keeps all of its history.
        labs: the parts a learner wrote, lab name -> file path or module name (``minengine/labs``, ``labs/README.md``):
            the engine runs on them; checked when the engine is built. None = the engine's own parts.

    Every count (tokens, blocks, sequences, steps) is at most ``MAX_COUNT`` (2**31 - 1), every byte size at most
    2**63 - 1, ``seed`` below 2**64, ``num_cpu_threads`` at most the cores this process may use; ``extra`` takes
    no keys yet.

    Raises:
        VLLMValidationError: (a ``ValueError``) naming the field and the limit, for any setting out of range.
    """

    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    swap_space_blocks: int | None = None
    scheduling_policy: str = "decode-first"
    prefill_decode_ratio: float = 1.0
    splitfuse_target_tokens: int | None = None
    priority_aging_steps: int = 64
    shrink_prefill_chunks: bool = False
    speculative_config: dict | SpeculativeConfig | None = None
    output_length_predictor: OutputLengthPredictor | None = None
    predicted_length_aging_steps: int = 4
    reserve_predicted_kv: bool = False
    seed: int = 0
    trace_block_tables: bool = True
    disable_log_stats: bool = False
    num_cpu_threads: int | None = 1
    gpu_memory_utilization: float | None = None
    swap_space_bytes: int | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    attention_backend: str = "auto"
    enforce_eager: bool | None = None
    max_logprobs: int = MAX_LOGPROBS
    served_model_name: str | None = None
    logits_processors: list | None = None
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    distributed_executor_backend: str | None = None
    async_scheduling: bool = False
    allow_cpu_oversubscription: bool = False
    execute_model_timeout_s: float = 300.0
    structured_outputs_config: dict | StructuredOutputsConfig | None = None
    max_history_bytes: int = DEFAULT_MAX_HISTORY_BYTES
    labs: dict[str, str] | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.served_model_name is None:
            bundled = self.model is None or self.model == BUNDLED_MODEL
            self.served_model_name = Path(BUNDLED_MODEL).name if bundled else self.model
        if self.model is None:
            self.model = BUNDLED_MODEL
        if not isinstance(self.model, str) or not self.model:
            _invalid("model", f"model must be a checkpoint directory or hub id (a non-empty string), "
                     f"got {show(self.model)}")
        if self.tokenizer is not None and (not isinstance(self.tokenizer, str) or not self.tokenizer):
            _invalid("tokenizer", f"tokenizer must be a directory or hub id (a non-empty string) or None, "
                     f"got {show(self.tokenizer)}")
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "trace_block_tables", "disable_log_stats"):
            if not isinstance(getattr(self, name), bool):
                _invalid(name, f"{name} must be a bool, got {show(getattr(self, name))}")
        if not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED:
            _invalid("seed", f"seed must be an integer in [0, 2**64 - 1], got {show(self.seed)}")
        if self.dtype not in _DTYPES:
            _invalid("dtype", f"dtype must be one of {_DTYPES}, got {show(self.dtype)}")
        if self.device not in ("cpu", "cuda", "auto"):
            _invalid("device", f"device must be 'cpu', 'cuda' or 'auto', got {show(self.device)}")
        _positive("block_size", self.block_size, MAX_BLOCK_SIZE)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive("max_num_seqs", self.max_num_seqs)
        if self.num_kv_blocks is not None:
            _positive("num_kv_blocks", self.num_kv_blocks)
        if self.kv_cache_memory_bytes is not None:
            _positive("kv_cache_memory_bytes", self.kv_cache_memory_bytes, MAX_BYTES)
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if self.num_cpu_threads is not None:
            # more threads than cores only makes torch's threads wait for each other
            cores = available_cpu_cores()
            if not _is_int(self.num_cpu_threads) or not 1 <= self.num_cpu_threads <= cores:
                _invalid("num_cpu_threads", f"num_cpu_threads must be None or an integer in [1, {cores}] (the CPU "
                         f"cores this process may use), got {show(self.num_cpu_threads)}")
        threshold = self.long_prefill_token_threshold
        _count("long_prefill_token_threshold", threshold)
        if threshold and not self.enable_chunked_prefill:
            _invalid("long_prefill_token_threshold",
                     f"long_prefill_token_threshold ({threshold}) caps prefill chunks and needs "
                     "enable_chunked_prefill=True: without chunked prefill a prompt runs in one step")
        if self.num_kv_blocks is not None and self.kv_cache_memory_bytes is not None:
            _invalid("num_kv_blocks", f"give num_kv_blocks ({self.num_kv_blocks}) or kv_cache_memory_bytes "
                     f"({self.kv_cache_memory_bytes}), not both: each sets the size of the KV pool")
        if not isinstance(self.extra, dict) or set(self.extra) - EXTRA_KEYS:
            unknown = sorted(map(str, set(self.extra) - EXTRA_KEYS)) if isinstance(self.extra, dict) else self.extra
            _invalid("extra", f"extra has unknown keys {show(unknown)}: it takes {sorted(EXTRA_KEYS) or 'none yet'} "
                     "(every engine setting is a field of its own)")
        self._check_loading()
        if self.preemption_mode not in PREEMPTION_MODES:
            _invalid("preemption_mode", f"preemption_mode must be one of {PREEMPTION_MODES}, "
                     f"got {show(self.preemption_mode)}")
        self._check_scheduling()
        self._check_parallel()

    @property
    def uses_worker_processes(self) -> bool:
        """Whether the model runs in worker processes (``distributed_executor_backend`` "mp", given or the
        default for ``tensor_parallel_size > 1`` or ``async_scheduling``) rather than in the engine's."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend == "mp"
        return self.tensor_parallel_size > 1 or self.async_scheduling

    def _check_parallel(self) -> None:
        """Validate the tensor-parallel and executor settings (ValueError naming the field)."""
        from minengine.distributed import check_cpu_cores

        _positive("tensor_parallel_size", self.tensor_parallel_size)
        for name in ("async_scheduling", "allow_cpu_oversubscription", "enable_expert_parallel"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        backend, tp = self.distributed_executor_backend, self.tensor_parallel_size
        if backend not in (None, "mp", "uni", "external_launcher"):
            raise ValueError(f"distributed_executor_backend must be 'mp', 'uni', 'external_launcher' or None, got "
                             f"{backend!r}")
        if backend == "external_launcher":
            self._check_external_launcher()
        if backend == "uni" and tp > 1:
            raise ValueError(f"distributed_executor_backend='uni' runs one process: tensor_parallel_size ({tp}) "
                             f"needs 'mp'")
        if backend == "uni" and self.async_scheduling:
            raise ValueError("async_scheduling schedules while worker processes run the model: it needs "
                             "distributed_executor_backend='mp' (or None)")
        if self.async_scheduling and self.speculative_config is not None:
            raise ValueError("async_scheduling does not support speculative_config (a step's accepted tokens "
                             "decide the next step's positions)")
        if self.uses_worker_processes and self.logits_processors:
            raise ValueError("logits_processors are not supported with worker processes (tensor_parallel_size > 1, "
                             "async_scheduling or distributed_executor_backend='mp'): they run in the engine's "
                             "process")
        t = self.execute_model_timeout_s
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0:
            raise ValueError(f"execute_model_timeout_s must be a number of seconds > 0, got {t!r}")
        if self.device == "cpu" and backend != "external_launcher":  # there each process is one rank
            check_cpu_cores(tp, self.allow_cpu_oversubscription)

    def _check_external_launcher(self) -> None:
        """Settings every rank of an external launcher's group could size differently, or that need worker
        processes (ValueError naming the field)."""
        if self.async_scheduling:
            raise ValueError("async_scheduling needs worker processes: not with "
                             "distributed_executor_backend='external_launcher'")
        if self.gpu_memory_utilization is not None:
            raise ValueError("gpu_memory_utilization sizes the KV pool from each machine's free memory, so the "
                             "ranks of distributed_executor_backend='external_launcher' could schedule differently: "
                             "give num_kv_blocks (or neither)")

    def _check_loading(self) -> None:
        """Validate the vLLM-compatible loading, memory and attention settings, the structured-outputs config and
        the history bound (VLLMValidationError naming the field)."""
        if self.attention_backend not in ATTENTION_BACKENDS:
            _invalid("attention_backend", f"attention_backend must be one of {ATTENTION_BACKENDS}, "
                     f"got {show(self.attention_backend)}")
        if self.attention_backend == "cpu" and self.device == "cuda":
            _invalid("attention_backend", "attention_backend 'cpu' (the C++ CPU kernel) needs device 'cpu'")
        if self.enforce_eager is not None and not isinstance(self.enforce_eager, bool):
            _invalid("enforce_eager", f"enforce_eager must be True, False or None, got {show(self.enforce_eager)}")
        u = self.gpu_memory_utilization
        if u is not None and (not isinstance(u, (int, float)) or isinstance(u, bool) or not 0 < u <= 1):
            _invalid("gpu_memory_utilization", f"gpu_memory_utilization must be in (0, 1] or None, got {show(u)}")
        if self.swap_space_bytes is not None:
            _positive("swap_space_bytes", self.swap_space_bytes, MAX_BYTES)
        if not isinstance(self.kv_cache_dtype, str) or self.kv_cache_dtype not in KV_CACHE_DTYPES:
            _invalid("kv_cache_dtype", f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, "
                     f"got {show(self.kv_cache_dtype)}")
        if not (self.quantization is None or isinstance(self.quantization, str)) \
                or self.quantization not in QUANTIZATIONS:
            _invalid("quantization", f"quantization must be one of {QUANTIZATIONS} ('experts_int8' is vLLM's name "
                     f"for minengine's 'int8': per-output-channel int8 weights), got {show(self.quantization)}")
        if self.quantization == "experts_int8":
            self.quantization = "int8"
        m = self.max_logprobs
        if not isinstance(m, int) or isinstance(m, bool) or not -1 <= m <= MAX_COUNT:
            _invalid("max_logprobs", f"max_logprobs must be -1 (no cap) or an integer in [0, {MAX_COUNT}], "
                     f"got {show(m)}")
        if not isinstance(self.trust_remote_code, bool):
            _invalid("trust_remote_code", f"trust_remote_code must be a bool, got {show(self.trust_remote_code)}")
        for name in ("revision", "served_model_name"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                _invalid(name, f"{name} must be a non-empty string or None, got {show(v)}")
        self.structured_outputs_config = StructuredOutputsConfig.from_any(self.structured_outputs_config)
        _positive("max_history_bytes", self.max_history_bytes, MAX_BYTES)

    def _check_scheduling(self) -> None:
        """Validate the scheduling-policy and swap settings (VLLMValidationError naming the field)."""
        if self.scheduling_policy not in POLICIES:
            _invalid("scheduling_policy", f"scheduling_policy must be one of {tuple(POLICIES)}, "
                     f"got {show(self.scheduling_policy)}")
        if self.swap_space_blocks is not None:
            _count("swap_space_blocks", self.swap_space_blocks)
        ratio = self.prefill_decode_ratio
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 1e-3 <= ratio <= 1e3:
            _invalid("prefill_decode_ratio", f"prefill_decode_ratio must be a number in [0.001, 1000], "
                     f"got {show(ratio)}")
        if self.splitfuse_target_tokens is not None:
            _positive("splitfuse_target_tokens", self.splitfuse_target_tokens)
            if self.splitfuse_target_tokens > self.max_num_batched_tokens:
                _invalid("splitfuse_target_tokens", f"splitfuse_target_tokens ({self.splitfuse_target_tokens}) "
                         f"must be <= max_num_batched_tokens ({self.max_num_batched_tokens})")
        _count("priority_aging_steps", self.priority_aging_steps)  # 0 = no aging
        if not isinstance(self.shrink_prefill_chunks, bool):
            _invalid("shrink_prefill_chunks",
                     f"shrink_prefill_chunks must be a bool, got {show(self.shrink_prefill_chunks)}")
        self.speculative_config = SpeculativeConfig.from_any(self.speculative_config)
        _count("predicted_length_aging_steps", self.predicted_length_aging_steps)  # 0 = no aging
        if not isinstance(self.reserve_predicted_kv, bool):
            _invalid("reserve_predicted_kv",
                     f"reserve_predicted_kv must be a bool, got {show(self.reserve_predicted_kv)}")
        lps = self.logits_processors
        if lps is not None:
            if not isinstance(lps, (list, tuple)) or any(not isinstance(c, (type, str)) for c in lps):
                _invalid("logits_processors", f"logits_processors must be a list of LogitsProcessor classes or "
                         f"'module:Class' names, got {show(lps)}")
            if lps and self.speculative_config is not None:
                _invalid("logits_processors", "logits_processors cannot be combined with speculative_config: custom "
                         "logits processors are not supported with speculative decoding (as in vLLM)")
        predictor = self.output_length_predictor
        if predictor is not None and not callable(getattr(predictor, "predict", None)):
            _invalid("output_length_predictor", f"output_length_predictor must be an OutputLengthPredictor (with "
                     f"predict(request)) or None, got {show(predictor)}")

    def check_against_model(self, max_position_embeddings: int) -> None:
        """Fill ``max_model_len`` from the model and check the budgets against it.

        Raises:
            VLLMValidationError: ``max_model_len`` beyond the model's positions, or (without chunked prefill) a
                token budget smaller than ``max_model_len``, as a whole prompt must fit in one step.
        """
        if self.max_model_len is None:
            self.max_model_len = max_position_embeddings
        if self.max_model_len > max_position_embeddings:
            _invalid("max_model_len", f"max_model_len ({self.max_model_len}) exceeds the model's "
                     f"max_position_embeddings ({max_position_embeddings})")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            _invalid("max_num_batched_tokens", f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                     f"max_model_len ({self.max_model_len}) when enable_chunked_prefill is False: a prompt is then "
                     "prefilled in one step")


@dataclass(frozen=True)
class VllmConfig:
    """What a custom logits processor's constructor receives as ``vllm_config`` (vLLM's ``VllmConfig``, the
    parts minengine has): ``model_config`` (``get_vocab_size()``, ``max_model_len``), ``scheduler_config``
    (``max_num_seqs``, ``max_num_batched_tokens``) and ``speculative_config``, all read from ``engine_config``.

    Attributes:
        engine_config: the engine's ``EngineConfig``. vocab_size: the model's logits width.
    """

    engine_config: EngineConfig
    vocab_size: int

    @property
    def model_config(self):
        from types import SimpleNamespace

        c = self.engine_config
        return SimpleNamespace(model=c.model, max_model_len=c.max_model_len, dtype=c.dtype,
                               get_vocab_size=lambda: self.vocab_size)

    @property
    def scheduler_config(self):
        from types import SimpleNamespace

        c = self.engine_config
        return SimpleNamespace(max_num_seqs=c.max_num_seqs, max_num_batched_tokens=c.max_num_batched_tokens,
                               max_model_len=c.max_model_len)

    @property
    def speculative_config(self):
        return self.engine_config.speculative_config

"""LLM: vLLM's offline interface, ``LLM(model).generate(prompts, sampling_params)`` and ``LLM.chat(messages)``."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from tqdm.auto import tqdm

from minengine.engine.arg_utils import EngineArgs
from minengine.engine.generation_config import default_sampling_overrides
from minengine.engine.llm_engine import LLMEngine, Prompt
from minengine.entrypoints.chat_utils import chat_prompts
from minengine.exceptions import VLLMValidationError
from minengine.metrics.reader import Metric
from minengine.outputs import RequestOutput
from minengine.sampling_params import RequestOutputKind, SamplingParams


class LLM:
    """Offline batch generation with continuous batching underneath (vLLM's ``LLM``).

    Args:
        model: Hugging Face checkpoint directory or hub id; ``None`` is the bundled tiny Shakespeare model.
        **kwargs: any ``EngineArgs`` field: the ``EngineConfig`` fields (``block_size``,
            ``max_num_batched_tokens``, ``num_kv_blocks``...) and vLLM's (``gpu_memory_utilization``,
            ``tensor_parallel_size=1``, ``enforce_eager``...; see ``minengine.engine.arg_utils``).

    Raises:
        ValueError: bad settings (see ``EngineConfig`` and ``EngineArgs``); TypeError: an unknown keyword.
    """

    def __init__(self, model: str | None = None, **kwargs):
        # As vLLM's LLM: no Prometheus series unless asked (``disable_log_stats=False``); an offline run reads its
        # numbers from the outputs' metrics and the engine's traces.
        kwargs.setdefault("disable_log_stats", True)
        try:
            args = EngineArgs(model=model, **kwargs)
        except TypeError as exc:
            raise TypeError(f"LLM(): {exc} (the keywords are EngineArgs fields)") from None
        self.llm_engine = LLMEngine.from_engine_args(args)
        self.generation_config = args.generation_config
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's defaults for this model: ``SamplingParams()`` updated by the checkpoint's generation_config
        (unless ``LLM(..., generation_config="vllm")``)."""
        if self.generation_config == "vllm":
            return SamplingParams()
        return SamplingParams(**default_sampling_overrides(self.llm_engine.model_path))

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool | Callable = True,
                 priority: Sequence[int] | int | None = None) -> list[RequestOutput]:
        """Generate for every prompt; returns the finished ``RequestOutput``s in input order.

        Args:
            prompts: a string, a ``TextPrompt`` / ``TokensPrompt`` dict (``{"prompt_token_ids": [...]}``), or a
                list of them.
            sampling_params: one for all prompts, or one per prompt; ``None`` = ``get_default_sampling_params()``.
                ``n > 1`` gives ``n`` completions per output (``outputs[i].index == i``).
            use_tqdm: show a progress bar over finished requests; a callable is used instead of ``tqdm`` to make
                it (vLLM's: called as ``use_tqdm(total=..., desc=..., dynamic_ncols=True)``, then ``update(1)``
                per finished prompt and ``close()``).
            priority: one int per prompt for ``scheduling_policy="priority"`` (as vLLM: smaller = more
                urgent), or one int for all; None = all 0.

        Raises:
            ValueError: any invalid prompt or parameter; nothing is queued then.
        """
        prompts = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = _one_per_prompt(sampling_params, len(prompts))
        priorities = _priorities(priority, len(prompts))
        params = _final_only(params)
        engine = self.llm_engine
        # Validate everything before queueing anything, so a bad prompt leaves the engine untouched.
        groups, used = [], set()
        for p, sp, pr in zip(prompts, params, priorities):
            groups.append(engine.make_requests(self._next_id(used), p, sp, priority=pr))
            used.add(groups[-1].request_id)
        ids = [g.request_id for g in groups]
        for g in groups:
            engine.enqueue(g)
        finished: dict[str, RequestOutput] = {}
        bar = _progress_bar(use_tqdm, len(groups))
        try:
            while len(finished) < len(groups):
                for out in engine.step():
                    if out.finished and out.request_id in used:
                        finished[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            engine.abort_request(ids)  # an interrupted call leaves nothing queued and no block held
            raise
        finally:
            if bar is not None:
                bar.close()
        return [finished[i] for i in ids]

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool | Callable = True, chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Generate replies to conversations (vLLM's ``LLM.chat``): each conversation (a list of
        ``{"role", "content"}`` dicts) goes through the model's chat template (or ``chat_template``), then
        ``generate``. ``messages`` is one conversation or a list of them.

        Raises:
            ValueError: no chat template, malformed messages, and as ``generate``.
        """
        prompts = chat_prompts(self.get_tokenizer(), messages, chat_template, add_generation_prompt,
                               continue_final_message, chat_template_kwargs)
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def get_metrics(self) -> list[Metric]:
        """vLLM's ``LLM.get_metrics()``: the engine's Prometheus series as ``minengine.metrics.reader`` objects."""
        return self.llm_engine.get_metrics()

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix; False (nothing changed) while a request holds blocks, unless
        ``reset_running_requests`` preempts them first (``LLMEngine.reset_prefix_cache``)."""
        return self.llm_engine.reset_prefix_cache(reset_running_requests)

    def _next_id(self, taken: set[str]) -> str:
        """The next request id not in use in the engine (the user may add requests of their own)."""
        while (rid := str(next(self._ids))) in taken or rid in self.llm_engine.scheduler.requests \
                or self.llm_engine.output_processor.is_in_use(rid):
            pass
        return rid


def _as_prompt_list(prompts) -> list:
    """One prompt (a string, a dict, a list of token ids) or a list / tuple of them, as a list of prompts."""
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise VLLMValidationError(f"prompts must be a prompt or a list of prompts, got {type(prompts).__name__}")
    return list(prompts)


def _one_per_prompt(sampling_params, num_prompts: int) -> list:
    """``sampling_params`` for each prompt: one for all, or a sequence of one per prompt."""
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * num_prompts
    if isinstance(sampling_params, Sequence) and not isinstance(sampling_params, (str, bytes)):
        params = list(sampling_params)
        if len(params) != num_prompts:
            raise VLLMValidationError(f"sampling_params has {len(params)} entries for {num_prompts} prompts",
                                      parameter="sampling_params")
        return params
    # a dict of settings would otherwise be iterated as its keys and reported as a str
    raise VLLMValidationError("sampling_params must be a SamplingParams or a list of them (one per prompt), "
                              f"got {type(sampling_params).__name__}", parameter="sampling_params")


def _final_only(params: list) -> list[SamplingParams]:
    """Copies with ``output_kind`` FINAL_ONLY: one output per request, when it finishes (what vLLM's LLM does)."""
    final = []
    for sp in params:
        if not isinstance(sp, SamplingParams):
            raise VLLMValidationError(f"sampling_params must be SamplingParams, got {type(sp).__name__}",
                                      parameter="sampling_params")
        sp = sp.clone()
        sp.output_kind = RequestOutputKind.FINAL_ONLY
        final.append(sp)
    return final


def _priorities(priority, num_prompts: int) -> list:
    """``priority`` for each prompt: None (all 0), one int for all, or a sequence of one per prompt."""
    if priority is None or (isinstance(priority, int) and not isinstance(priority, bool)):
        return [priority or 0] * num_prompts
    if not isinstance(priority, Sequence) or isinstance(priority, (str, bytes)):
        raise VLLMValidationError("priority must be an int or a list of ints (one per prompt), "
                                  f"got {type(priority).__name__}", parameter="priority")
    priority = list(priority)
    if len(priority) != num_prompts:
        raise VLLMValidationError(f"priority has {len(priority)} entries for {num_prompts} prompts",
                                  parameter="priority")
    return priority


def _progress_bar(use_tqdm: bool | Callable, total: int):
    """tqdm (or the caller's ``use_tqdm`` callable, vLLM's signature) over ``total`` prompts; None: no bar."""
    if not use_tqdm:
        return None
    make_bar = use_tqdm if callable(use_tqdm) else tqdm
    return make_bar(total=total, desc="Processed prompts", dynamic_ncols=True)

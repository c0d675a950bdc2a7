"""LLM: vLLM's offline interface, ``LLM(model).generate(prompts, sampling_params)``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from tqdm.auto import tqdm

from minengine.config import EngineConfig
from minengine.engine.llm_engine import LLMEngine, Prompt
from minengine.outputs import RequestOutput
from minengine.sampling_params import SamplingParams


class LLM:
    """Offline batch generation with continuous batching underneath.

    Args:
        model: Hugging Face checkpoint directory or hub id; ``None`` is the bundled tiny Shakespeare model.
        **kwargs: any ``EngineConfig`` field (``block_size``, ``max_num_batched_tokens``, ``num_kv_blocks``...).

    Raises:
        ValueError: bad settings (see ``EngineConfig``).
    """

    def __init__(self, model: str | None = None, **kwargs):
        self.llm_engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Generate for every prompt; returns the finished ``RequestOutput``s in input order.

        Args:
            prompts: a string, a token-id dict ``{"prompt_token_ids": [...]}``, or a list of either.
            sampling_params: one for all prompts, or one per prompt; ``None`` = ``SamplingParams()``.
            use_tqdm: show a progress bar over finished requests.
            priority: one priority per prompt for ``scheduling_policy="priority"`` (as vLLM: smaller = more
                urgent); None = all 0.

        Raises:
            ValueError: any invalid prompt or parameter; nothing is queued then.
        """
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a prompt or a list of prompts, got {type(prompts).__name__}")
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params has {len(params)} entries for {len(prompts)} prompts")
        priority = [0] * len(prompts) if priority is None else list(priority)
        if len(priority) != len(prompts):
            raise ValueError(f"priority has {len(priority)} entries for {len(prompts)} prompts")
        engine = self.llm_engine
        # Validate everything before queueing anything, so a bad prompt leaves the engine untouched.
        requests = [engine.make_request(self._next_id(), p, sp, priority=pr)
                    for p, sp, pr in zip(prompts, params, priority)]
        ids = [r.request_id for r in requests]
        for r in requests:
            engine.enqueue(r)
        finished: dict[str, RequestOutput] = {}
        try:
            with tqdm(total=len(requests), desc="Processed prompts", disable=not use_tqdm) as bar:
                while len(finished) < len(requests):
                    for out in engine.step():
                        if out.finished and out.request_id in ids:
                            finished[out.request_id] = out
                            bar.update(1)
        except BaseException:
            engine.abort_request(ids)  # an interrupted call leaves nothing queued and no block held
            raise
        return [finished[i] for i in ids]

    def _next_id(self) -> str:
        """The next request id not in use in the engine (the user may add requests of their own)."""
        while (rid := str(next(self._ids))) in self.llm_engine.scheduler.requests:
            pass
        return rid

"""The predicted-lengths door: each request gets a predicted output length, and admission may reserve for it.

Opened by a policy that orders by predicted length (``shortest-predicted-first``), an ``output_length_predictor``
or ``reserve_predicted_kv``. ``PredictedLengths`` (scheduler mixin) sets ``Request.predicted_output_len`` when a
request is added; ``PredictedAdmission`` (step-builder mixin) admits, with ``reserve_predicted_kv``, only
requests whose predicted blocks fit beside the running requests' predicted needs ("predict the output length,
allocate for it": S3, Jin et al., NeurIPS 2023).
"""

from __future__ import annotations

from minengine.core.kv_cache_manager import cdiv
from minengine.core.predictors import OraclePredictor
from minengine.request import Request


class PredictedLengths:
    """Scheduler mixin: a predictor sets each added request's ``predicted_output_len``."""

    @staticmethod
    def open_door(scheduler, predictor=None, **_) -> None:
        # without a predictor: max_tokens, exact when requests run to max_tokens (ignore_eos)
        scheduler.predictor = OraclePredictor() if predictor is None else predictor

    def add_request(self, request: Request) -> None:
        request.predicted_output_len = self.predictor.predict(request)
        super().add_request(request)


class PredictedAdmission:
    """Step-builder mixin: ``reserve_predicted_kv`` admission."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._reserved: int | None = None  # blocks the running requests are predicted to need still

    def first_chunk(self, request: Request, limit: int, free: int) -> int:
        if self.config.reserve_predicted_kv and not self._fits_predicted(request, free):
            return 0
        return super().first_chunk(request, limit, free)

    def admit_next(self, limit: int | None = None, reserve_running: bool = False) -> int:
        num_new = super().admit_next(limit, reserve_running)
        if num_new and self._reserved is not None:  # the newcomer's predicted need joins the others'
            self._reserved += self._predicted_need(self._scheduled[-1][0])
        return num_new

    def predicted_blocks(self, request: Request) -> int:
        """KV blocks ``request`` will hold at its predicted end: prompt + predicted output (at least one more
        token than it has, at most ``max_model_len``)."""
        predicted = request.predicted_output_len
        if predicted is None:
            predicted = request.sampling_params.max_tokens
        final = request.num_prompt_tokens + max(predicted, request.num_output_tokens + 1)
        return cdiv(min(final, self.config.max_model_len), self.kv.block_size)

    def _predicted_need(self, request: Request) -> int:
        """Blocks ``request`` is predicted to take beyond those it holds."""
        return max(0, self.predicted_blocks(request) - len(self.kv.req_to_blocks.get(request.request_id, ())))

    def _fits_predicted(self, request: Request, free: int) -> bool:
        """Admit ``request`` only when ``free`` blocks cover its predicted blocks beyond what the running
        requests are predicted to need still, so that fewer running requests are preempted later. A request
        predicted too short is admitted too early and may be preempted (or make others be) when it outgrows
        its prediction. With nothing running, a request is always admitted (else one predicted longer than the
        pool would wait forever)."""
        if not self.running:
            return True
        if self._reserved is None:  # once per step; admissions then add their own need
            self._reserved = sum(self._predicted_need(r) for r in self.running)
        return free - self._reserved >= self.predicted_blocks(request)

"""What the scheduler decided, in words: one sentence per step, built from its ``StepTrace`` alone.

"step 12: 10 decodes + a 502-token chunk of r10; r3 preempted (no free block); 4 waiting". The sentence names
what the step computed (decodes, each prefill chunk: a chunk that does not reach the end of its request's known
tokens, the last chunk, a whole prefill, a prefill after a prefix-cache hit; speculative proposals verified and
accepted), then what changed (admitted, preempted and why, swapped, finished, timed out), then the queue after the
step. The scheduler preempts only when a request's next tokens need a KV block and none is free
(``core/step_builder.py``: ``allocate_slots`` failed), so that is the reason given.
"""

from __future__ import annotations

from collections.abc import Sequence

from minengine.metrics.trace import ScheduledChunk, StepTrace
from minengine.viz.i18n import t

MAX_IDS = 4  # ids named in one list; the rest are counted ("r1, r2, r3, r4 and 5 more")


def _ids(ids: Sequence[str], lang: str) -> str:
    shown = ", ".join(ids[:MAX_IDS]) if lang == "en" else "、".join(ids[:MAX_IDS])
    if len(ids) > MAX_IDS:
        shown += t("story_more", lang).format(n=len(ids) - MAX_IDS)
    return shown


def _blocks(key: str, n: int, lang: str) -> str:
    """A count of blocks in words, singular for one ("1 block swapped back in")."""
    return t(f"{key}_one", lang) if n == 1 else t(key, lang).format(blocks=n)


def _prefill(c: ScheduledChunk, admitted: bool, lang: str) -> str:
    """One prefill chunk in words: whole / chunk / last chunk, after a prefix-cache hit when it was admitted this
    step with tokens already computed."""
    fields = {"tokens": c.num_tokens, "rid": c.request_id, "cached": c.start_pos}
    if admitted and c.start_pos > 0:
        return t("story_hit_prefill" if c.sampled else "story_hit_chunk", lang).format(**fields)
    if c.start_pos == 0 and c.sampled:
        return t("story_whole_prefill", lang).format(**fields)
    return t("story_last_chunk" if c.sampled else "story_chunk", lang).format(**fields)


def step_sentence(tr: StepTrace, lang: str = "en") -> str:
    """The step in one sentence, e.g. "step 12: 10 decodes + a 502-token chunk of r10; r3 preempted (no free
    block); 4 waiting" / "第 12 步：10 个解码 + r10 的一个 502 词元分块；r3 被抢占（没有空闲块）；4 个等待".

    Args:
        tr: one ``StepTrace`` (``engine.traces[i]``).
        lang: "en" or "zh".

    Raises:
        ValueError: unknown language.
    """
    admitted = set(tr.admitted_ids)
    decodes = [c for c in tr.chunks if not c.is_prefill]
    work = []
    if decodes:
        proposed = sum(c.num_spec_tokens for c in decodes)
        key = "story_decode" if len(decodes) == 1 else "story_decodes"
        text = t(key, lang).format(n=len(decodes))
        if proposed:
            verifying = sum(1 for c in decodes if c.num_spec_tokens)
            text += t("story_spec", lang).format(n=verifying, proposed=proposed,
                                                 accepted=sum(c.num_accepted_tokens for c in decodes))
        work.append(text)
    work += [_prefill(c, c.request_id in admitted, lang) for c in tr.chunks if c.is_prefill]
    head = t("story_step", lang).format(step=tr.step)
    parts = [" + ".join(work) if work else t("story_nothing", lang)]
    sep = "; " if lang == "en" else "；"
    if tr.admitted_ids:
        parts.append(t("story_admitted", lang).format(ids=_ids(tr.admitted_ids, lang)))
    if tr.preempted_ids:
        if tr.num_swapped_out_blocks:
            why = _blocks("story_swapped_out", tr.num_swapped_out_blocks, lang)
        else:  # "r3 ... its K/V", "r5, r4 ... their K/V"
            why = t("story_recompute" if len(tr.preempted_ids) == 1 else "story_recompute_many", lang)
        parts.append(t("story_preempted", lang).format(ids=_ids(tr.preempted_ids, lang), why=why))
    if tr.num_swapped_in_blocks:
        parts.append(_blocks("story_swapped_in", tr.num_swapped_in_blocks, lang))
    timed_out = [r for r in tr.timed_out_ids]
    finished = [r for r in tr.finished_ids if r not in set(timed_out)]
    if finished:
        parts.append(t("story_finished", lang).format(ids=_ids(finished, lang)))
    if timed_out:
        parts.append(t("story_timed_out", lang).format(ids=_ids(timed_out, lang)))
    parts.append(t("story_waiting", lang).format(n=tr.num_waiting))
    return head + sep.join(parts)


def step_sentences(traces: Sequence[StepTrace], lang: str = "en") -> list[str]:
    """``step_sentence`` of every step, in order."""
    return [step_sentence(tr, lang) for tr in traces]

"""The dashboard's "what to look at" captions, built from what the run on screen holds, so that no caption points
at something the run does not have (a long prompt in a run without one, shared blocks in a run without prefix
hits, proposals in a run without speculation).

``run_features`` reads a run's ``StepTrace``s; each caption is a base sentence that is true of every run plus one
sentence per feature present (and, for preset (a), the lesson of its long prompt).
"""

from __future__ import annotations

from collections.abc import Sequence

from minengine.metrics.trace import StepTrace
from minengine.viz.i18n import t

FEATURES = ("chunked", "prefix_hit", "shared_blocks", "cached_free", "preempted", "swapped", "spec", "waiting")


def run_features(traces: Sequence[StepTrace]) -> frozenset[str]:
    """What a run shows, from its steps:

    - ``chunked``: a prefill chunk that did not reach the end of its request's tokens (a prompt split over steps);
    - ``prefix_hit``: prompt tokens found in the prefix cache at admission;
    - ``shared_blocks``: a KV block held by more than one request at some step (needs block tables in the trace);
    - ``cached_free``: a free block that still holds a cached prefix at some step;
    - ``preempted`` / ``swapped``: a preemption / KV blocks swapped out to the CPU;
    - ``spec``: speculative proposals verified;
    - ``waiting``: a request waiting after some step.
    """
    found = set()
    for tr in traces:
        if any(c.is_prefill and not c.sampled for c in tr.chunks):
            found.add("chunked")
        if tr.prefix_hit_tokens:
            found.add("prefix_hit")
        if tr.block_ref_counts is not None and any(n > 1 for n in tr.block_ref_counts):
            found.add("shared_blocks")
        if tr.num_cached_free_blocks:
            found.add("cached_free")
        if tr.preempted_ids:
            found.add("preempted")
        if tr.num_swapped_out_blocks:
            found.add("swapped")
        if tr.num_spec_tokens:
            found.add("spec")
        if tr.num_waiting:
            found.add("waiting")
    return frozenset(found)


def _join(parts: list[str], lang: str) -> str:
    return (" " if lang == "en" else "").join(parts)


def block_pool_caption(features: frozenset[str], lang: str) -> str:
    """The block pool's caption: shared blocks and cached free blocks only when the run has them."""
    parts = [t("cap_pool_base", lang)]
    if "shared_blocks" in features:
        parts.append(t("cap_pool_shared", lang).format(hit=t("prefix_cache_hit", lang)))
    if "cached_free" in features:
        parts.append(t("cap_pool_cached", lang))
    return _join(parts, lang)


def block_tables_caption(features: frozenset[str], lang: str) -> str:
    """The block tables' caption: shared cells only when the run has shared blocks."""
    parts = [t("cap_tables_base", lang).format(bt=t("block_table", lang), sm=t("slot_mapping", lang))]
    if "shared_blocks" in features:
        parts.append(t("cap_tables_shared", lang))
    return _join(parts, lang)


def batch_caption(features: frozenset[str], preset: str, lang: str) -> str:
    """The batch figure's caption: the bars and markers every run has, then the preset's lesson and one sentence
    per feature the run shows (chunked prompts, prefix hits, preemptions and swaps, proposals, a queue)."""
    parts = [t("cap_batch_base", lang).format(pf=t("prefill", lang), tb=t("token_budget", lang),
                                              adm=t("admission", lang))]
    if preset == "a":
        key = "cap_batch_a_chunked" if "chunked" in features else "cap_batch_a_whole"
        parts.append(t(key, lang).format(hol=t("head_of_line_blocking", lang)))
    elif "chunked" in features:
        parts.append(t("cap_batch_chunked", lang).format(cp=t("chunked_prefill", lang)))
    if "prefix_hit" in features:
        parts.append(t("cap_batch_prefix", lang).format(hit=t("prefix_cache_hit", lang)))
    if "preempted" in features:
        parts.append(t("cap_batch_swapped" if "swapped" in features else "cap_batch_preempted", lang))
    if "spec" in features:
        parts.append(t("cap_batch_spec", lang))
    if "waiting" in features:
        parts.append(t("cap_batch_waiting", lang).format(slot=t("sequence_slot", lang)))
    return _join(parts, lang)


def queue_caption(features: frozenset[str], lang: str) -> str:
    """The queue figure's caption: why requests waited, or that none did."""
    key = "cap_queue" if "waiting" in features else "cap_queue_none"
    return t(key, lang).format(slot=t("sequence_slot", lang), tb=t("token_budget", lang))


def kv_caption(features: frozenset[str], lang: str) -> str:
    """The KV figure's caption: cached prefixes and preemptions only when the run has them."""
    parts = [t("cap_kv_base", lang)]
    if "cached_free" in features:
        parts.append(t("cap_kv_cached", lang))
    if "preempted" in features:
        parts.append(t("cap_kv_preempted", lang))
    return _join(parts, lang)


def itl_caption(num_labelled: int, lang: str) -> str:
    """The ITL figure's caption for a run whose figure labels ``num_labelled`` stalls (``len(labelled_stalls(...))``):
    red points and labels only when there are some (a run without stalls was told to look at "the 3 largest")."""
    if num_labelled == 0:
        return t("cap_itl_none", lang)
    return t("cap_itl_one", lang) if num_labelled == 1 else t("cap_itl", lang).format(n=num_labelled)

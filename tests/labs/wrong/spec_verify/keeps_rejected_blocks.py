"""A wrong speculative decoding part. The bug: never frees the blocks that held only rejected proposals (a KV block
leak while the request runs)."""

from __future__ import annotations

from minengine.request import Request, RequestStatus


def propose(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Up to ``k`` tokens that followed the earliest earlier occurrence of the longest matching suffix (see the
    skeleton). A scan of the text per call: fine for a lab; the engine keeps an index (``core/spec_decode.py``)."""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n):  # occurrences followed by at least one token, earliest first
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def accept(proposals: list[int], target: list[int]) -> list[int]:
    """The accepted prefix of ``proposals`` plus the target's own next token (see the skeleton)."""
    kept = []
    for proposal, choice in zip(proposals, target):
        if proposal != choice:
            break
        kept.append(proposal)
    return kept + [target[len(kept)]]  # the correction, or the bonus when every proposal matched


def verify_step(target_argmax: list[int], proposals: list[list[int]]) -> list[list[int]]:
    """Each request's tokens from its own ``len(proposals) + 1`` rows (see the skeleton)."""
    tokens, row = [], 0
    for spec in proposals:
        rows = target_argmax[row:row + len(spec) + 1]
        tokens.append(accept(spec, rows))
        row += len(spec) + 1
    return tokens


def commit_verified(scheduler, request: Request, tokens: list[int]) -> RequestStatus | None:
    """Advance, free the rejected proposals' blocks, append until a stop (see the skeleton)."""
    request.num_computed_tokens += len(tokens)
    for token in tokens:
        status = scheduler.append_token(request, token)
        if status is not None:
            return status
    return None

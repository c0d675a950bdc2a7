"""Lab 7: speculative decoding by prompt lookup, and its verification. Implement the four functions below; the
engine then proposes tokens for every decode with YOUR ``propose``, verifies greedy proposals with YOUR
``verify_step`` and commits them with YOUR ``commit_verified``.

Speculative decoding in one picture: a decode whose last tokens also appeared earlier in its text gets k
proposed tokens (the continuation of that earlier occurrence: prompt lookup). The step computes the decode's
latest token AND the k proposals in one forward, so the model's logits come in k + 1 rows: row i is the
distribution after the first i proposals. Under greedy decoding the target's own choice at row i is
``argmax(row i)``. A proposal is kept while it equals the target's choice; at the first mismatch the target's
choice replaces it (the correction) and the rest is thrown away; if all k match, row k gives one more token for
free (the bonus). So a step yields 1 to k + 1 tokens, exactly those one-token-at-a-time decoding would give.

Grade it with ``python -m minengine lab grade spec_verify labs/spec_verify/spec_verify.py``.
"""

from __future__ import annotations

from minengine.request import Request, RequestStatus


def propose(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Prompt lookup: guess the next tokens of a text by finding where its ending occurred before.

    Take the longest n, from ``n_max`` down to ``n_min`` (and at most ``len(tokens) - 1``), for which the last n
    tokens (the suffix) also occur EARLIER in ``tokens``, as an occurrence followed by at least one token (so
    never the suffix itself). Of those occurrences take the EARLIEST, and propose the tokens that followed it.

    Args:
        tokens: the request's tokens so far (prompt + generated).
        k: the most tokens to propose (>= 1).
        n_min, n_max: the n-gram lengths tried (1 <= n_min <= n_max).

    Returns:
        up to ``k`` tokens (fewer when the text ends sooner after the occurrence); [] when no suffix of a length
        in [n_min, n_max] occurred earlier.
    """
    raise NotImplementedError("implement propose: for n from n_max down to n_min, find the earliest earlier "
                              "occurrence of the last n tokens and return the (up to) k tokens after it")


def accept(proposals: list[int], target: list[int]) -> list[int]:
    """The tokens one request keeps from one verifying step.

    Args:
        proposals: the k proposed tokens (k >= 0).
        target: the target model's greedy choice at each of the request's k + 1 rows.

    Returns:
        the longest prefix of ``proposals`` that agrees with ``target``, then ONE token of the target's own:
        the correction (``target[i]`` at the first mismatch i) or, when every proposal was accepted, the bonus
        ``target[k]``. Between 1 and k + 1 tokens.
    """
    raise NotImplementedError("implement accept: walk proposals while proposals[i] == target[i], then add "
                              "target at the first mismatch (or target[k], the bonus, when all matched)")


def verify_step(target_argmax: list[int], proposals: list[list[int]]) -> list[list[int]]:
    """Verify a whole step: the sampled rows of every request, laid out one request after another.

    Args:
        target_argmax: the argmax of every sampled logits row of the step, in order. Request r owns
            ``len(proposals[r]) + 1`` consecutive rows (a request without proposals: one row, its next token).
        proposals: per request, in row order, the tokens it proposed this step ([] for none).

    Returns:
        per request, the tokens it gets (``accept`` of its proposals against its own rows).
    """
    raise NotImplementedError("implement verify_step: cut target_argmax into each request's "
                              "len(proposals) + 1 rows, then accept them")


def commit_verified(scheduler, request: Request, tokens: list[int]) -> RequestStatus | None:
    """Commit a verified step to a request (the scheduler's side, after the forward and the verification).

    The step computed K/V for the request's latest token and its k proposals; ``tokens`` are what it keeps
    (accepted proposals + one). So:

    - progress: ``request.num_computed_tokens`` grows by ``len(tokens)`` (the latest token and the accepted
      proposals now have valid K/V; the token sampled last has none yet, as after a plain decode);
    - blocks: the blocks past the ones the computed tokens need held only rejected proposals: give them back
      with ``scheduler.kv.truncate(request, num_blocks_to_keep)`` (``scheduler.kv.block_size`` tokens a block);
    - tokens: append them ONE at a time with ``scheduler.append_token(request, token)``, which returns a
      finished status when that token stops the request (``max_tokens``, EOS, a stop token): then stop
      appending and return that status.

    Returns:
        the finished status if one of the tokens stopped the request, else None.
    """
    raise NotImplementedError("implement commit_verified: advance num_computed_tokens by len(tokens), "
                              "truncate its blocks to those the computed tokens fill, append tokens until one stops it")

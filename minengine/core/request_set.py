"""RequestSet: the scheduler's running requests, in admission order, with O(1) append, remove and membership.

A list makes finishing or preempting one of N running requests cost O(N) (``list.remove`` compares its way
along the list), so a step in which many requests finish costs O(N x finished). An insertion-ordered dict keyed
by the request (requests compare by identity, ``Request`` is ``eq=False``) keeps the order and makes each of
these O(1); iterating it is as fast as iterating a list.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from minengine.request import Request


class RequestSet:
    """Requests in the order they were appended; each at most once.

    Supports what the scheduler and its readers use of a list: ``append``, ``remove``, ``in``, ``len``,
    iteration (forwards and ``reversed``) and indexing (``[0]`` and ``[-1]`` in O(1), any other index in O(N)).

    Raises:
        ValueError: ``append`` of a request already in the set, ``remove`` of one not in it.
    """

    __slots__ = ("_requests",)

    def __init__(self, requests: Iterable[Request] = ()):
        self._requests: dict[Request, None] = {}
        for request in requests:
            self.append(request)

    def append(self, request: Request) -> None:
        if request in self._requests:
            raise ValueError(f"request {request.request_id!r} is already running")
        self._requests[request] = None

    def remove(self, request: Request) -> None:
        try:
            del self._requests[request]
        except KeyError:
            raise ValueError(f"request {request.request_id!r} is not running") from None

    def __contains__(self, request: object) -> bool:
        return request in self._requests

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)

    def __reversed__(self) -> Iterator[Request]:
        return reversed(self._requests)

    def __len__(self) -> int:
        return len(self._requests)

    def __getitem__(self, index: int) -> Request:
        if not self._requests:
            raise IndexError("no running requests")
        if index == 0:
            return next(iter(self._requests))
        if index == -1:
            return next(reversed(self._requests))
        return list(self._requests)[index]

    def __repr__(self) -> str:
        return f"RequestSet({[r.request_id for r in self._requests]})"

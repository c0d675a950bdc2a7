"""A served engine's history, bounded in bytes: step traces and finished requests' metrics, oldest dropped first.

An offline engine keeps every ``StepTrace`` and every request's ``RequestMetrics`` (the course reads all of
them). A server runs for days: without a bound its memory grows with every request. A count bound is not
enough, because the entries differ in size: a step trace holds the block table of every running request, and
a request's metrics hold one inter-token latency per output token. So each entry is measured once, when it
becomes history (``entry_bytes``), and ``ByteBoundedFifo`` keeps the newest entries whose sizes add up to at
most ``max_history_bytes`` (``EngineConfig``, ``--max-history-bytes``).

The measure is Python's own (``sys.getsizeof`` of the object and of everything it holds, each object once), so
the bound is on what the entries occupy, not on an estimate of it.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Hashable


def entry_bytes(obj) -> int:
    """The bytes ``obj`` occupies with everything it holds (lists, tuples, dicts, sets, dataclass fields and
    ``__slots__``), each object counted once; shared objects (small ints, interned strings) are counted too,
    so this is an upper bound of what dropping ``obj`` frees.

    Returns:
        a byte count (int, > 0).
    """
    seen: set[int] = set()
    total = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset, deque)):
            stack.extend(item)
        elif not isinstance(item, (str, bytes, int, float, bool, type(None))):
            attrs = getattr(item, "__dict__", None)
            if attrs is not None:
                stack.append(attrs)
            for name in getattr(type(item), "__slots__", ()):
                if hasattr(item, name):
                    stack.append(getattr(item, name))
    return total


class ByteBoundedFifo:
    """Keys of history entries with their sizes, oldest first, within a byte budget.

    ``push`` adds the newest entry and returns the keys to drop (oldest first) so that the kept sizes add up to
    at most ``max_bytes``: the kept entries are always the longest run of newest entries that fits. An entry
    larger than ``max_bytes`` on its own cannot be kept: it is dropped at once, with everything older.

    Args:
        max_bytes: the budget (bytes, >= 1).

    Raises:
        ValueError: ``max_bytes`` < 1.
    """

    def __init__(self, max_bytes: int):
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
            raise ValueError(f"max_history_bytes must be an integer >= 1, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.total_bytes = 0
        self.num_dropped = 0
        self._entries: deque[tuple[Hashable, int]] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[Hashable]:
        """The kept keys, oldest first."""
        return [key for key, _ in self._entries]

    def push(self, key: Hashable, size: int) -> list[Hashable]:
        """Add the newest entry (``size`` bytes) and return the keys to drop, oldest first (``key`` itself
        last, when it alone exceeds the budget)."""
        self._entries.append((key, size))
        self.total_bytes += size
        dropped = []
        while self.total_bytes > self.max_bytes:
            old, old_size = self._entries.popleft()
            self.total_bytes -= old_size
            dropped.append(old)
        self.num_dropped += len(dropped)
        return dropped


class EngineHistory:
    """Keeps an engine's history (``engine.traces``, finished requests in ``engine.request_metrics``) within
    ``max_bytes`` and ``max_entries`` of each kind, measuring each entry once when it becomes history; the async
    engine calls ``record`` after every step. Entries are known by keys that hold no reference to them, so
    whatever else drops an entry (``reset_stats``) frees it at once; its size then stays counted until its key
    leaves the budget, which only makes the bound stricter.

    Args:
        engine: the ``LLMEngine`` (read and trimmed between steps, by the engine loop only).
        max_bytes: the budget (bytes, >= 1), ``EngineConfig.max_history_bytes``.
        max_entries: at most this many step traces and this many finished requests' metrics (None: no count
            bound), the server's ``--max-history-steps``.

    Raises:
        ValueError: ``max_bytes`` < 1.
    """

    def __init__(self, engine, max_bytes: int, max_entries: int | None = None):
        self.engine = engine
        self.fifo = ByteBoundedFifo(max_bytes)
        self.max_entries = max_entries
        self.counted: dict[str, float] = {}  # finished request id -> its finished_time, for those in the budget
        self._last_trace: tuple | None = None  # the key of the newest trace counted
        self._num_past = 0  # entries of engine._past_metrics counted (they are appended at its end)

    def _new_traces(self) -> list:
        """The traces appended since the last ``record`` (all of them after a ``reset_stats``)."""
        traces = self.engine.traces
        i = len(traces)
        while i > 0 and (traces[i - 1].step, traces[i - 1].start_time) != self._last_trace:
            i -= 1
        return traces[i:]

    def record(self) -> None:
        """Count the step traces appended since the last call (rolled-back steps' too) and the requests they
        finished (and any other finished request not counted yet: aborted ones), then drop the oldest entries
        beyond the budget and the count bound."""
        engine = self.engine
        dropped = []
        for trace in self._new_traces():
            self._last_trace = (trace.step, trace.start_time)
            dropped += self.fifo.push(("step", trace.step, trace.start_time), entry_bytes(trace))
            for rid in trace.finished_ids:
                dropped += self._push_finished(rid)
        dropped += self._push_past()
        if len(self.counted) < len(engine.request_metrics) - len(engine.scheduler.requests):
            for rid, m in list(engine.request_metrics.items()):
                if m.finished_time is not None and self.counted.get(rid) != m.finished_time:
                    dropped += self._push_finished(rid)
        self._drop(dropped)
        self._bound_counts()

    def _push_finished(self, rid: str) -> list:
        m = self.engine.request_metrics.get(rid)
        if m is None or m.finished_time is None or self.counted.get(rid) == m.finished_time:
            return []
        self.counted[rid] = m.finished_time
        return self.fifo.push(("request", rid, m.finished_time), entry_bytes(m))

    def _push_past(self) -> list:
        """Count the metrics the engine moved to ``_past_metrics`` (a finished request whose id was used
        again); ``reset_stats`` replaces that list, and the count starts again."""
        past = self.engine._past_metrics
        if self._num_past > len(past):
            self._num_past = 0
        dropped = []
        for m in past[self._num_past:]:
            dropped += self.fifo.push(("past", id(past), m.arrival_time), entry_bytes(m))
        self._num_past = len(past)
        return dropped

    def _drop(self, keys: list) -> None:
        """Remove the dropped entries that are still there (traces are a prefix of ``engine.traces``)."""
        engine = self.engine
        steps = {key[1:] for key in keys if key[0] == "step"}
        k = 0
        while k < len(engine.traces) and (engine.traces[k].step, engine.traces[k].start_time) in steps:
            k += 1
        if k:
            del engine.traces[:k]
        past = engine._past_metrics
        n_past = sum(1 for key in keys if key[0] == "past" and key[1] == id(past))
        if n_past:  # the oldest are at the front, in the order they were counted
            del past[:n_past]
            self._num_past -= n_past
        for kind, rid, finished_time in keys:
            if kind == "request" and self.counted.get(rid) == finished_time:
                del self.counted[rid]
                m = engine.request_metrics.get(rid)
                if m is not None and m.finished_time == finished_time:
                    del engine.request_metrics[rid]

    def _bound_counts(self) -> None:
        """The count bound, in batches of a tenth of it (so its cost is paid rarely)."""
        engine, keep = self.engine, self.max_entries
        if keep is None:
            return
        slack = max(1, keep // 10)
        if len(engine.traces) > keep + slack:
            del engine.traces[:len(engine.traces) - keep]
        if len(self.counted) > keep + slack:
            for rid in list(self.counted)[:len(self.counted) - keep]:  # oldest first (insertion order)
                m = engine.request_metrics.get(rid)
                if m is not None and m.finished_time == self.counted.pop(rid):
                    del engine.request_metrics[rid]

    def measured_bytes(self) -> int:
        """The history's size now in bytes, measured again from the engine (the traces and finished requests it
        holds, those moved aside for a reused id included): at most ``max_bytes`` between two steps (what a test
        or a benchmark checks)."""
        engine = self.engine
        return (sum(entry_bytes(t) for t in engine.traces) + sum(entry_bytes(m) for m in engine._past_metrics)
                + sum(entry_bytes(m) for m in engine.request_metrics.values() if m.finished_time is not None))

"""Real request traces: the Azure LLM inference trace (CSV) and the Mooncake trace (JSONL), as ``Trace``s.

Sources (cite them wherever a figure uses the data):
- Azure LLM inference trace 2023: Patel et al., "Splitwise: Efficient generative LLM inference using phase
  splitting", ISCA 2024 (github.com/Azure/AzurePublicDataset). Arrival times and token counts, no text.
- Mooncake FAST'25 trace: Qin et al., "Mooncake: Trading More Storage for Less Computation", FAST 2025
  (github.com/kvcache-ai/Mooncake). Arrival times, token counts and the hash ids of 512-token prompt blocks,
  so requests sharing a prefix can be told apart from requests that do not.

Neither trace has prompt text. Azure requests get synthetic token ids at replay time (distinct per request,
so no prefix sharing). Mooncake hash ids become token ids here, deterministically, so equal leading hash ids
give equal leading tokens and therefore real prefix-cache hits in the engine.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

MOONCAKE_HASH_BLOCK_TOKENS = 512  # tokens covered by one Mooncake hash id (the trace's README)
BUNDLED_VOCAB_SIZE = 2048  # the bundled tiny Shakespeare model's vocabulary (minengine/assets)
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

# "2023-11-16 18:15:46.6805900": 7 fractional digits (100 ns), more than datetime.strptime's %f takes, so
# the fraction is parsed by hand. An optional zone suffix ("Z", "+00:00") is accepted for other releases.
_AZURE_TIME = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?$")


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace.

    Attributes:
        arrival_time: seconds from the trace start (the start of the selected window).
        prompt_len: prompt tokens (after length scaling), >= 1.
        output_len: tokens to generate (after length scaling), >= 1; replayed as ``max_tokens`` with
            ``ignore_eos=True`` so the engine produces exactly this many (unless clipped to ``max_model_len``).
        prompt_token_ids: the prompt's token ids (``len == prompt_len``), or None when the trace has no text
            and the replay synthesizes ids.
        request_id: stable id, e.g. ``"azure-17"`` for the 18th data row of the file.
    """

    arrival_time: float
    prompt_len: int
    output_len: int
    prompt_token_ids: list[int] | None
    request_id: str


class Trace(list):
    """A list of ``TraceRequest`` in arrival order that remembers where it came from.

    It is a plain ``list`` (index it, slice it, iterate it) with metadata:

    Attributes:
        source: where the requests came from (a file path, or e.g. ``"poisson(rate=2.0)"``).
        length_scale: the factor applied to the trace's prompt and output lengths (1.0 = real lengths).
            Figures made from a scaled trace must say so.
        time_offset_s: seconds between the file's first arrival and this trace's time 0 (the window start).
        tokens_per_hash_block: Mooncake only: tokens each 512-token hash block became after scaling.
    """

    def __init__(self, requests=(), *, source: str = "", length_scale: float = 1.0, time_offset_s: float = 0.0,
                 tokens_per_hash_block: int | None = None):
        super().__init__(requests)
        self.source = source
        self.length_scale = length_scale
        self.time_offset_s = time_offset_s
        self.tokens_per_hash_block = tokens_per_hash_block

    def __getitem__(self, index):
        items = super().__getitem__(index)
        return self.with_requests(items) if isinstance(index, slice) else items  # a slice stays a Trace

    @property
    def requests(self) -> list[TraceRequest]:
        """The requests as a plain list (a copy)."""
        return list(self)

    def with_requests(self, requests, source: str | None = None) -> Trace:
        """A trace with other requests and the same metadata (``source`` replaced when given)."""
        return Trace(requests, source=self.source if source is None else source, length_scale=self.length_scale,
                     time_offset_s=self.time_offset_s, tokens_per_hash_block=self.tokens_per_hash_block)

    @property
    def duration_s(self) -> float:
        """Seconds from time 0 to the last arrival."""
        return self[-1].arrival_time if self else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second over first -> last arrival (NaN with fewer than 2 requests or no time span)."""
        if len(self) < 2 or self[-1].arrival_time <= self[0].arrival_time:
            return math.nan
        return (len(self) - 1) / (self[-1].arrival_time - self[0].arrival_time)

    def __repr__(self) -> str:
        return (f"Trace({len(self)} requests from {self.source!r}, length_scale={self.length_scale}, "
                f"duration {self.duration_s:.1f} s)")


# ---- shared helpers -----------------------------------------------------------------------------------------
def _check_options(max_requests, start_s, end_s, length_scale) -> None:
    if max_requests is not None and (not isinstance(max_requests, int) or isinstance(max_requests, bool)
                                     or max_requests < 1):
        raise ValueError(f"max_requests must be a positive integer or None, got {max_requests!r}")
    if not isinstance(length_scale, (int, float)) or isinstance(length_scale, bool) or not length_scale > 0 \
            or not math.isfinite(length_scale):
        raise ValueError(f"length_scale must be a finite number > 0, got {length_scale!r}")
    for name, v in (("start_s", start_s), ("end_s", end_s)):
        if v is not None and (not isinstance(v, (int, float)) or not v >= 0):
            raise ValueError(f"{name} must be a number >= 0 (seconds from the trace start) or None, got {v!r}")
    if start_s is not None and end_s is not None and end_s <= start_s:
        raise ValueError(f"end_s ({end_s}) must be greater than start_s ({start_s})")


def _scale(n: int, length_scale: float) -> int:
    """A token count scaled, rounded, and at least 1 (every request keeps a prompt and an output token)."""
    return max(1, round(n * length_scale))


def _window(rows: list[tuple], start_s, end_s, max_requests) -> tuple[list[tuple], float]:
    """Rows ``(t_seconds_from_file_start, ...)`` inside [start_s, end_s), first ``max_requests`` of them, with
    times shifted so the window starts at 0. Returns (rows, offset)."""
    offset = float(start_s or 0.0)
    out = [r for r in rows if (start_s is None or r[0] >= start_s) and (end_s is None or r[0] < end_s)]
    if max_requests is not None:
        out = out[:max_requests]
    return [(r[0] - offset, *r[1:]) for r in out], offset


def _to_text(text_or_bytes) -> str:
    if isinstance(text_or_bytes, (bytes, bytearray)):
        return bytes(text_or_bytes).decode("utf-8-sig")
    if not isinstance(text_or_bytes, str):
        raise ValueError(f"expected the file's text (str or bytes), got {type(text_or_bytes).__name__}")
    return text_or_bytes.lstrip("\ufeff")


def _csv_fields(line: str, line_no: int) -> list[str]:
    """One CSV line's fields; ``csv.Error`` (a field over the csv module's size limit, a NUL byte) becomes a
    ``ValueError`` naming the line."""
    try:
        return next(csv.reader([line]))
    except csv.Error as exc:
        raise ValueError(f"line {line_no}: not a valid CSV line ({exc})") from None


def _json_line(line: str, line_no: int):
    """One JSON Lines line, parsed; errors (bad JSON, nesting too deep to parse) name the line."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {line_no}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise ValueError(f"line {line_no}: JSON nested too deeply to parse") from None


def _int_field(value, line_no: int, column: str, minimum: int) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ValueError(f"line {line_no}: column {column!r} must be an integer, got {value!r}") from None
    if n < minimum:
        raise ValueError(f"line {line_no}: column {column!r} must be >= {minimum}, got {n}")
    return n


# ---- Azure -------------------------------------------------------------------------------------------------
def parse_azure_timestamp(text: str) -> float:
    """Seconds since the Unix epoch of an Azure trace timestamp such as ``2023-11-16 18:15:46.6805900``.

    The fraction may have up to 9 digits (the 2023 trace uses 7, i.e. 100 ns); a zone suffix is optional and
    the time is taken as UTC without one. Raises ``ValueError`` on any other format.
    """
    m = _AZURE_TIME.match(text.strip())
    if m is None:
        raise ValueError(f"timestamp {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'")
    date, clock, frac, zone = m.groups()
    dt = datetime.strptime(f"{date} {clock}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        hh, mm = int(zone[1:3]), int(zone[-2:])
        dt -= sign * timedelta(hours=hh, minutes=mm)
    return dt.timestamp() + (int(frac) / 10 ** len(frac) if frac else 0.0)


def parse_azure_csv(text_or_bytes, max_requests: int | None = None, start_s: float | None = None,
                    end_s: float | None = None, length_scale: float = 1.0, source: str = "<text>") -> Trace:
    """Parse the Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Data: Patel et al., "Splitwise", ISCA 2024 (Azure/AzurePublicDataset, ``AzureLLMInferenceTrace_*.csv``).

    Args:
        text_or_bytes: the file's content.
        max_requests: keep the first N requests (after the window), None = all.
        start_s, end_s: keep requests arriving in [start_s, end_s) seconds after the file's first arrival;
            the kept requests' ``arrival_time`` counts from ``start_s`` (0 when None).
        length_scale: multiply prompt (``ContextTokens``) and output (``GeneratedTokens``) lengths, rounded,
            at least 1 token each; recorded in ``Trace.length_scale``.
        source: a name for ``Trace.source``.

    Returns:
        A ``Trace`` sorted by arrival (stable), ``prompt_token_ids=None``, ids ``"azure-<data row index>"``.

    Raises:
        ValueError: a missing column in the header, or a row with the wrong number of fields, a malformed
            timestamp, a non-integer / negative token count, or a line the csv module rejects (a field over
            its size limit), naming the line (1 = the header) and column; bad options, naming the option.
    """
    _check_options(max_requests, start_s, end_s, length_scale)
    lines = _to_text(text_or_bytes).splitlines()
    if not lines or not lines[0].strip():
        raise ValueError("line 1: empty input, expected the header 'TIMESTAMP,ContextTokens,GeneratedTokens'")
    header = [h.strip() for h in _csv_fields(lines[0], 1)]
    lower = [h.lower() for h in header]
    index = {}
    for col in AZURE_COLUMNS:
        if col.lower() not in lower:
            raise ValueError(f"line 1: header {lines[0]!r} has no column {col!r} "
                             f"(expected {','.join(AZURE_COLUMNS)})")
        index[col] = lower.index(col.lower())
    rows = []
    first = None
    for line_no, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = _csv_fields(line, line_no)  # csv, not split(","): a re-saved copy may quote its fields
        if len(fields) != len(header):
            raise ValueError(f"line {line_no}: {len(fields)} fields, the header has {len(header)}: {line!r}")
        try:
            t = parse_azure_timestamp(fields[index["TIMESTAMP"]])
        except ValueError as exc:
            raise ValueError(f"line {line_no}: column 'TIMESTAMP': {exc}") from None
        prompt = _int_field(fields[index["ContextTokens"]], line_no, "ContextTokens", 1)
        output = _int_field(fields[index["GeneratedTokens"]], line_no, "GeneratedTokens", 0)
        first = t if first is None else min(first, t)
        rows.append((t, prompt, output, len(rows)))
    rows = [(t - first, p, o, i) for t, p, o, i in rows]
    rows.sort(key=lambda r: r[0])  # the published file is sorted; a user's copy might not be
    rows, offset = _window(rows, start_s, end_s, max_requests)
    reqs = [TraceRequest(arrival_time=t, prompt_len=_scale(p, length_scale), output_len=_scale(o, length_scale),
                         prompt_token_ids=None, request_id=f"azure-{i}") for t, p, o, i in rows]
    return Trace(reqs, source=source, length_scale=float(length_scale), time_offset_s=offset)


def load_azure_trace(path: str | os.PathLike, max_requests: int | None = None, start_s: float | None = None,
                     end_s: float | None = None, length_scale: float = 1.0) -> Trace:
    """Load an Azure LLM inference trace CSV from ``path``; see ``parse_azure_csv`` for the options.

    Data: Patel et al., "Splitwise", ISCA 2024. The conversation trace is in
    ``find_data_dir() / "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"``.

    Returns a ``Trace`` (a ``list[TraceRequest]`` with ``.length_scale`` and ``.source``).
    Raises ``ValueError`` on malformed content (line and column named), ``FileNotFoundError`` when absent.
    """
    path = _trace_file(path, AZURE_CONV_RELPATH)
    _check_options(max_requests, start_s, end_s, length_scale)
    try:
        return parse_azure_csv(path.read_bytes(), max_requests=max_requests, start_s=start_s, end_s=end_s,
                               length_scale=length_scale, source=str(path))
    except ValueError as exc:  # name the file
        raise ValueError(f"{path}: {exc}") from None


# ---- Mooncake ----------------------------------------------------------------------------------------------
def tokens_per_hash_block(length_scale: float, block_size: int) -> int:
    """Tokens one scaled 512-token Mooncake block becomes: ``512 * length_scale`` rounded to a multiple of
    ``block_size`` (at least one block), so a shared hash block covers whole KV blocks and can be a prefix hit.
    """
    return max(block_size, round(MOONCAKE_HASH_BLOCK_TOKENS * length_scale / block_size) * block_size)


def hash_block_token_ids(hash_id: int, num_tokens: int, vocab_size: int) -> list[int]:
    """The ``num_tokens`` token ids that stand for Mooncake hash block ``hash_id``: pseudo-random in
    ``[0, vocab_size)``, a pure function of its arguments (same ids in every process and run)."""
    rng = random.Random(hash_id * 1_000_003 + 17)  # int seeds are hashed deterministically by random
    return [rng.randrange(vocab_size) for _ in range(num_tokens)]


def parse_mooncake_jsonl(text_or_bytes, max_requests: int | None = None, start_s: float | None = None,
                         end_s: float | None = None, length_scale: float = 1.0, block_size: int = 16,
                         vocab_size: int = BUNDLED_VOCAB_SIZE, source: str = "<text>") -> Trace:
    """Parse the Mooncake trace JSONL (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``).

    Data: Qin et al., "Mooncake", FAST 2025 (kvcache-ai/Mooncake, ``FAST25-release/traces``).

    Hash id i of a request covers its prompt tokens [512 i, 512 (i+1)). Each hash id becomes
    ``T = tokens_per_hash_block(length_scale, block_size)`` deterministic token ids (``hash_block_token_ids``),
    the prompt is the concatenation of its blocks' ids, and the last block is cut to the (scaled) remainder.
    So two requests with equal leading hash ids have equal leading tokens, aligned to KV blocks: the engine's
    prefix cache hits them as it would the real conversations. Prompt lengths scale by ``T / 512`` (which is
    ``length_scale`` rounded to whole KV blocks per hash block); output lengths by ``length_scale``.

    Args:
        text_or_bytes: the file's content.
        max_requests, start_s, end_s: as ``parse_azure_csv`` (seconds, from the file's first timestamp).
        length_scale: length factor, recorded in ``Trace.length_scale``.
        block_size: the engine's KV block size in tokens (a scaled hash block is a multiple of it).
        vocab_size: token ids are drawn from [0, vocab_size): the model's ``vocab_size``
            (default: the bundled model's, 2048).

    Returns:
        A ``Trace`` sorted by arrival with ``prompt_token_ids`` set, ids ``"mooncake-<line index>"``.

    Raises:
        ValueError: a line that is not a JSON object, a missing or non-integer field, a negative value, or
            ``len(hash_ids) != ceil(input_length / 512)``, naming the line (1-based) and field; bad options.
    """
    _check_options(max_requests, start_s, end_s, length_scale)
    for name, v in (("block_size", block_size), ("vocab_size", vocab_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    rows = []
    for line_no, line in enumerate(_to_text(text_or_bytes).splitlines(), start=1):
        if not line.strip():
            continue
        obj = _json_line(line, line_no)
        if not isinstance(obj, dict):
            raise ValueError(f"line {line_no}: expected a JSON object, got {type(obj).__name__}")
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in obj:
                raise ValueError(f"line {line_no}: missing field {key!r}")
        t_ms = obj["timestamp"]
        if not isinstance(t_ms, (int, float)) or isinstance(t_ms, bool) or not 0 <= t_ms < float("inf"):
            raise ValueError(f"line {line_no}: field 'timestamp' must be a finite number >= 0 (ms), got {t_ms!r}")
        values = {}
        for key, minimum in (("input_length", 1), ("output_length", 0)):
            v = obj[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
                raise ValueError(f"line {line_no}: field {key!r} must be an integer >= {minimum}, got {v!r}")
            values[key] = v
        hash_ids = obj["hash_ids"]
        if not isinstance(hash_ids, list) or any(not isinstance(h, int) or isinstance(h, bool) for h in hash_ids):
            raise ValueError(f"line {line_no}: field 'hash_ids' must be a list of integers")
        expected = math.ceil(values["input_length"] / MOONCAKE_HASH_BLOCK_TOKENS)
        if len(hash_ids) != expected:
            raise ValueError(f"line {line_no}: field 'hash_ids' has {len(hash_ids)} ids, but input_length "
                             f"{values['input_length']} needs ceil({values['input_length']}/512) = {expected}")
        rows.append((t_ms / 1000.0, values["input_length"], values["output_length"], hash_ids, len(rows)))
    rows.sort(key=lambda r: r[0])
    rows, offset = _window(rows, start_s, end_s, max_requests)

    per_block = tokens_per_hash_block(length_scale, block_size)
    cache: dict[int, list[int]] = {}  # hash id -> its tokens; shared lists keep memory at one copy per id
    reqs = []
    for t, input_len, output_len, hash_ids, i in rows:
        last = input_len - MOONCAKE_HASH_BLOCK_TOKENS * (len(hash_ids) - 1)  # tokens in the last, partial block
        last_scaled = max(1, min(per_block, round(last * per_block / MOONCAKE_HASH_BLOCK_TOKENS)))
        ids: list[int] = []
        for k, h in enumerate(hash_ids):
            block = cache.get(h)
            if block is None:
                block = cache[h] = hash_block_token_ids(h, per_block, vocab_size)
            ids += block if k < len(hash_ids) - 1 else block[:last_scaled]
        reqs.append(TraceRequest(arrival_time=t, prompt_len=len(ids), output_len=_scale(output_len, length_scale),
                                 prompt_token_ids=ids, request_id=f"mooncake-{i}"))
    return Trace(reqs, source=source, length_scale=float(length_scale), time_offset_s=offset,
                 tokens_per_hash_block=per_block)


def load_mooncake_trace(path: str | os.PathLike, max_requests: int | None = None, start_s: float | None = None,
                        end_s: float | None = None, length_scale: float = 1.0, block_size: int = 16,
                        vocab_size: int = BUNDLED_VOCAB_SIZE) -> Trace:
    """Load a Mooncake trace JSONL from ``path``; see ``parse_mooncake_jsonl`` for the options.

    Data: Qin et al., "Mooncake", FAST 2025. The synthetic trace is in
    ``find_data_dir() / "traces/mooncake_fast25/synthetic_trace.jsonl"``. Its prompts are long (median 11.6k
    tokens): use ``length_scale`` (e.g. 1/16) and ``max_requests`` or a window on a CPU.

    Raises ``ValueError`` on malformed content (line and field named), ``FileNotFoundError`` when absent.
    """
    path = _trace_file(path, MOONCAKE_RELPATH)
    _check_options(max_requests, start_s, end_s, length_scale)
    try:
        return parse_mooncake_jsonl(path.read_bytes(), max_requests=max_requests, start_s=start_s, end_s=end_s,
                                    length_scale=length_scale, block_size=block_size, vocab_size=vocab_size,
                                    source=str(path))
    except ValueError as exc:  # name the file
        raise ValueError(f"{path}: {exc}") from None


def synthetic_prompt_ids(request_id: str, length: int, vocab_size: int, seed: int = 0) -> list[int]:
    """Deterministic pseudo-random prompt token ids in ``[0, vocab_size)`` for a trace request without text.

    A pure function of its arguments, so a replay is repeatable; different request ids give unrelated ids,
    so such prompts do not share prefixes (the Azure trace carries no prefix information).
    """
    rng = random.Random(f"{seed}:{request_id}")  # str seeds go through sha512: stable across processes
    return [rng.randrange(vocab_size) for _ in range(length)]


AZURE_CONV_RELPATH = "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
MOONCAKE_RELPATH = "traces/mooncake_fast25/synthetic_trace.jsonl"


def _trace_file(path: str | os.PathLike | None, relpath: str) -> Path:
    """``path`` as a ``Path``; for None (what ``azure_conv_path`` / ``mooncake_path`` return when the data folder
    or the file is absent) a ``FileNotFoundError`` that says where the file goes."""
    if path is None:
        raise FileNotFoundError(f"trace file not found: put {Path(relpath).name} at <data>/{relpath}, where <data> "
                                "is ../shared/data next to the repository, or the folder in $MINENGINE_DATA "
                                "(find_data_dir); or pass the file's path")
    return Path(path)


def azure_conv_path(data_dir: Path | None) -> Path | None:
    """The Azure 2023 conversation trace inside a ``shared/data`` folder, None when absent."""
    p = data_dir / AZURE_CONV_RELPATH if data_dir else None
    return p if p is not None and p.exists() else None


def mooncake_path(data_dir: Path | None) -> Path | None:
    """The Mooncake FAST'25 synthetic trace inside a ``shared/data`` folder, None when absent."""
    p = data_dir / MOONCAKE_RELPATH if data_dir else None
    return p if p is not None and p.exists() else None

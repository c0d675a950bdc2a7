"""Structured outputs: a request's constraint compiled into a token automaton, and its bitmask per step.

Idea (Willard & Louf, "Efficient Guided Generation for LLMs", 2023; XGrammar, Dong et al., MLSys 2025): a JSON
schema, a regex, a list of choices or an EBNF grammar defines which strings are valid outputs. Compiled against
the tokenizer's vocabulary it becomes an automaton whose state, after the tokens generated so far, says which
next tokens keep the output a prefix of a valid string: a bitmask over the vocabulary, one bit per token id.
The sampler sets the logits of the masked tokens to -inf before anything else, so every sampled token is valid,
greedy or sampled; the request stops when the automaton accepts its stop token (EOS), i.e. the output is
complete. The grammar engine is xgrammar (``xgrammar`` on PyPI, vLLM's default backend): it compiles all five
kinds of constraint, fills a mask in microseconds, and rolls back, which speculative decoding needs.

Where the state lives: ``Request.structured_output`` holds the request's ``StructuredOutputRequest``, next to its
output tokens. The scheduler advances it in ``update_from_output`` with each committed token (one way, in
commit order), so a step that fails and is rolled back never advanced it, and a request preempted by recompute
keeps the state of the outputs it keeps. The sampler only reads it (``fill_bitmask``); to verify speculative
proposals it advances it through the proposals it accepts and rolls it back before returning.

Backends (vLLM's ``StructuredOutputsConfig.backend``): xgrammar compiles every kind of constraint, but compiles
some JSON-schema keywords into a grammar that ignores them (``xgrammar_unenforced_keywords``); ``"auto"`` (the
default) then uses llguidance (``structured_output_guidance.py``), as vLLM's ``auto`` does, and a keyword
neither enforces is refused by name. Both fill the same bitmask, so the scheduler and the sampler do not know
which one a request has.

xgrammar is imported on the first structured request: an engine that never sees one never loads it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import time
from dataclasses import dataclass

import torch

from minengine.config import StructuredOutputsConfig
from minengine.exceptions import VLLMValidationError
from minengine.sampling_params import StructuredOutputsParams

_CPP_PREFIX = re.compile(r"\[[^\]]*\]\s*\S+:\d+:\s*")  # "[22:31:55] /project/cpp/x.cc:83: " before xgrammar's text


def _clean(exc: Exception) -> str:
    """xgrammar's error text without the C++ source location."""
    text = _CPP_PREFIX.sub("", str(exc)).strip()
    return text.replace("Check failed: ", "").splitlines()[0] if text else type(exc).__name__


def _ebnf_literal(text: str) -> str:
    """``text`` as an EBNF string literal (quotes, backslashes and control characters escaped)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def choice_grammar(choices: list[str]) -> str:
    """The EBNF grammar whose strings are exactly ``choices`` (vLLM's ``choice_as_grammar``)."""
    return "root ::= " + " | ".join(_ebnf_literal(c) for c in choices)


def close_additional_properties(schema):
    """A copy of ``schema`` with ``additionalProperties: false`` on every object schema that leaves it unset
    (``disable_additional_properties``)."""
    if isinstance(schema, list):
        return [close_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: close_additional_properties(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def load_json_schema(value: str | dict) -> dict:
    """The schema of ``structured_outputs.json`` as a dict, checked against its JSON Schema meta-schema
    (``jsonschema``).

    Raises:
        ValueError: naming ``structured_outputs.json``: not JSON, not an object / boolean, or not a valid schema.
    """
    import jsonschema

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
    if not isinstance(value, (dict, bool)):
        raise ValueError(f"structured_outputs.json must be a JSON schema object, got {value!r}")
    try:
        jsonschema.validators.validator_for(value).check_schema(value)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the root"
        raise ValueError(f"structured_outputs.json is not a valid JSON schema (at {where}): {exc.message}") from None
    return value if isinstance(value, dict) else ({} if value else {"not": {}})


# Keywords xgrammar compiles into a grammar that does not enforce them (checked against xgrammar's own matcher:
# it accepts an output that breaks them), vLLM's ``has_xgrammar_unsupported_json_features`` list included.
XGRAMMAR_UNENFORCED = ("multipleOf", "uniqueItems", "contains", "minContains", "maxContains", "format",
                       "patternProperties", "propertyNames", "not", "if", "then", "else", "dependentRequired",
                       "dependentSchemas", "unevaluatedProperties", "unevaluatedItems")
_NAME_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_DATA = ("const", "enum", "default", "examples", "required", "dependentRequired")  # values that are not schemas


def xgrammar_unenforced_keywords(schema) -> list[str]:
    """The keywords of a JSON schema that xgrammar would not enforce, each once, in the order found: those of
    ``XGRAMMAR_UNENFORCED`` (``uniqueItems: false`` is no constraint) and ``pattern`` together with
    ``minLength`` / ``maxLength`` on one string (xgrammar keeps the pattern and drops the lengths)."""
    found: list[str] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(reversed(node))
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in XGRAMMAR_UNENFORCED and not (key == "uniqueItems" and value is False):
                found.append(key)
        if "pattern" in node and ("minLength" in node or "maxLength" in node):
            found.append("pattern with " + ("maxLength" if "maxLength" in node else "minLength"))
        for key, value in node.items():
            if key in _NAME_MAPS and isinstance(value, dict):
                stack.extend(value.values())
            elif key not in _DATA:
                stack.append(value)
    return list(dict.fromkeys(found))


class StructuredOutputManager:
    """One engine's grammar compilers: xgrammar's ``TokenizerInfo`` of the tokenizer and a ``GrammarCompiler``
    (which caches compiled grammars by their source), and llguidance's tokenizer when a request needs it, each
    built on the first structured request that uses it.

    Args:
        tokenizer: the engine's Hugging Face tokenizer (structured outputs need one).
        vocab_size: the model's logits width (the bitmask covers it; ids the tokenizer lacks are never allowed).
        eos_token_id: the token that ends a complete output (the grammar's stop token); None = the tokenizer's.
        config: the engine's ``StructuredOutputsConfig`` (backend, engine-wide whitespace / properties settings);
            None = the defaults (backend "auto").

    Raises:
        ValueError: (from ``new_request``) no tokenizer, or a constraint the backend cannot compile or enforce,
            naming the field (``structured_outputs.json`` / ``.regex`` / ...) and, for a schema, the keyword.
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_id: int | None,
                 config: StructuredOutputsConfig | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.config = config if config is not None else StructuredOutputsConfig()
        self._compiler = None
        self._guidance = None
        self._checked_schemas: dict[str, str] = {}  # JSON text -> the text xgrammar compiles (checked once)
        self._guidance_grammars: dict[str, str] = {}  # constraint key -> its checked llguidance grammar

    @property
    def compiler(self):
        if self._compiler is None:
            if self.tokenizer is None:
                raise ValueError("structured_outputs needs a tokenizer (the model has none): the grammar is "
                                 "compiled against the tokenizer's vocabulary")
            import xgrammar as xgr

            stop = [self.eos_token_id] if self.eos_token_id is not None else None
            try:
                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=stop)
            except Exception as exc:  # a tokenizer xgrammar cannot read (its errors are RuntimeError/ValueError)
                raise ValueError(f"structured_outputs: the tokenizer cannot be used by xgrammar: {_clean(exc)}") \
                    from None
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler

    def compile(self, so: StructuredOutputsParams):
        """The xgrammar ``CompiledGrammar`` of a constraint (cached by the compiler).

        Raises:
            ValueError: naming the field, when xgrammar rejects the constraint or the schema is invalid.
        """
        compiler = self.compiler
        kind = so.kind
        if so.whitespace_pattern is not None:
            raise ValueError("structured_outputs.whitespace_pattern is not supported by the xgrammar backend "
                             "(as in vLLM); use disable_any_whitespace")
        try:
            if kind == "json":
                return compiler.compile_json_schema(self.schema_text(so), any_whitespace=not so.disable_any_whitespace)
            if kind == "json_object":
                return compiler.compile_builtin_json_grammar()
            if kind == "regex":
                if "\x00" in so.regex:  # vLLM rejects it early too: no backend handles a NUL in a pattern
                    raise ValueError("structured_outputs.regex must not contain a NUL character")
                return compiler.compile_regex(so.regex)
            if kind == "choice":
                return compiler.compile_grammar(choice_grammar(so.choice))
            if kind == "grammar":
                return compiler.compile_grammar(so.grammar)
            return self._compile_structural_tag(so.structural_tag)
        except ValueError:
            raise
        except Exception as exc:  # xgrammar reports parse errors as RuntimeError (C++ exceptions)
            raise ValueError(f"structured_outputs.{kind} cannot be compiled: {_clean(exc)}") from None

    def schema_text(self, so: StructuredOutputsParams) -> str:
        """The JSON text of a ``json`` constraint's schema, checked against its meta-schema (once per distinct
        schema: n > 1, repeated requests) and with ``additionalProperties`` closed if asked.

        Raises:
            ValueError: naming ``structured_outputs.json``, as ``load_json_schema``.
        """
        key = f"{so.disable_additional_properties}:" + (so.json if isinstance(so.json, str) else
                                                         json.dumps(so.json, sort_keys=True))
        text = self._checked_schemas.get(key)
        if text is None:
            schema = load_json_schema(so.json)
            if so.disable_additional_properties:
                schema = close_additional_properties(schema)
            text = json.dumps(schema)
            if len(self._checked_schemas) < 1024:
                self._checked_schemas[key] = text
        return text

    def _compile_structural_tag(self, text: str):
        """vLLM's two structural-tag formats: ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``
        (the older one) or xgrammar's ``StructuralTag`` JSON."""
        import xgrammar as xgr

        try:
            tag = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"structured_outputs.structural_tag is not valid JSON: {exc}") from None
        if isinstance(tag, dict) and "structures" in tag:
            items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                     for s in tag["structures"]]
            return self.compiler.compile_structural_tag(items, tag.get("triggers", []))
        return self.compiler.compile_structural_tag(text)

    def with_engine_settings(self, so: StructuredOutputsParams) -> StructuredOutputsParams:
        """``so`` with the engine-wide ``disable_any_whitespace`` / ``disable_additional_properties`` of the
        config added (either side asking is enough, as vLLM ORs them)."""
        cfg = self.config
        if not (cfg.disable_any_whitespace or cfg.disable_additional_properties):
            return so
        return dataclasses.replace(
            so, disable_any_whitespace=so.disable_any_whitespace or cfg.disable_any_whitespace,
            disable_additional_properties=so.disable_additional_properties or cfg.disable_additional_properties)

    def backend_for(self, so: StructuredOutputsParams) -> str:
        """Which backend serves a constraint: the configured one, or with ``"auto"`` (vLLM's rule) xgrammar unless
        the schema has keywords xgrammar would not enforce or xgrammar cannot compile it; then "guidance".

        Raises:
            ValueError: backend "xgrammar" and a schema keyword it would not enforce (naming it); or, from
                ``compile``, a constraint neither backend can compile.
        """
        backend = self.config.backend
        if so.kind == "regex" and "\x00" in so.regex:  # vLLM rejects it early too: no backend handles a NUL
            raise ValueError("structured_outputs.regex must not contain a NUL character")
        if backend == "guidance":
            return backend
        unenforced = xgrammar_unenforced_keywords(json.loads(self.schema_text(so))) if so.kind == "json" else []
        if unenforced and backend == "xgrammar":
            raise ValueError(f"structured_outputs.json uses {', '.join(repr(k) for k in unenforced)}, which the "
                             "xgrammar backend does not enforce (the server's structured-outputs backend is "
                             "'xgrammar'; 'auto' would use llguidance)")
        if unenforced or backend == "xgrammar" or so.kind == "structural_tag":
            return "guidance" if unenforced else "xgrammar"
        try:
            self.compile(so)  # cached by the compiler: new_request does not compile it again
            return "xgrammar"
        except ValueError:
            if so.whitespace_pattern is not None or not self._guidance_accepts(so):
                raise  # xgrammar's own message
            return "guidance"

    def _guidance_accepts(self, so: StructuredOutputsParams) -> bool:
        try:
            self._guidance_grammar(so)
            return True
        except ValueError:
            return False

    def _guidance_grammar(self, so: StructuredOutputsParams) -> str:
        """The llguidance grammar of a constraint, checked (cached per distinct constraint).

        Raises:
            ValueError: naming the field (and the schema keywords llguidance cannot enforce).
        """
        from minengine.worker.structured_output_guidance import GuidanceBackend, guidance_grammar

        if so.whitespace_pattern is not None:
            raise ValueError("structured_outputs.whitespace_pattern is not supported (use disable_any_whitespace)")
        if self._guidance is None:
            if self.tokenizer is None:
                raise ValueError("structured_outputs needs a tokenizer (the model has none)")
            self._guidance = GuidanceBackend(self.tokenizer, self.vocab_size, self.eos_token_id)
        key = repr(dataclasses.astuple(so))
        grammar = self._guidance_grammars.get(key)
        if grammar is None:
            schema = json.loads(self.schema_text(so)) if so.kind == "json" else None
            grammar = guidance_grammar(so, schema, so.disable_any_whitespace)
            self._guidance.check(grammar, f"structured_outputs.{so.kind}")
            if len(self._guidance_grammars) < 1024:
                self._guidance_grammars[key] = grammar
        return grammar

    def new_request(self, so: StructuredOutputsParams):
        """A fresh grammar state for one request (each of ``n`` children gets its own): a
        ``StructuredOutputRequest`` (xgrammar) or a ``GuidanceRequest`` (llguidance), with the same methods.

        Raises:
            ValueError: naming the field, as ``backend_for`` / ``compile``.
        """
        import xgrammar as xgr

        so = self.with_engine_settings(so)
        if self.backend_for(so) == "guidance":
            grammar = self._guidance_grammar(so)  # builds the backend on first use
            return self._guidance.new_request(grammar)
        return StructuredOutputRequest(xgr.GrammarMatcher(self.compile(so)), self.vocab_size)


class StructuredOutputRequest:
    """One request's grammar state (an xgrammar ``GrammarMatcher``) after its committed output tokens.

    Args:
        matcher: the matcher, at the start of the output.
        vocab_size: the logits width V (bits past the tokenizer's vocabulary are never set).
    """

    __slots__ = ("matcher", "vocab_size", "num_accepted")

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.num_accepted = 0

    # ---- the scheduler's side: committed tokens --------------------------------------------------------------
    def accept_token(self, token: int) -> bool:
        """Advance by one committed output token; False (state unchanged) when the grammar rejects it."""
        ok = self.matcher.accept_token(token)
        self.num_accepted += ok
        return ok

    def is_terminated(self) -> bool:
        """True once the grammar accepted its stop token: the output is complete and the request stops."""
        return self.matcher.is_terminated()

    # ---- the sampler's side ----------------------------------------------------------------------------------
    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the next-token mask of the current state into ``bitmask[row]`` ([R, ceil(V / 32)] int32, bit
        ``t % 32`` of word ``t // 32`` set when token t is allowed)."""
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def speculate(self, token: int) -> bool:
        """Advance through a proposal the sampler accepted while verifying (undone by ``rollback``)."""
        return self.matcher.accept_token(token)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` speculative advances."""
        if num_tokens:
            self.matcher.rollback(num_tokens)

def grammar_state(processor, params) -> StructuredOutputRequest:
    """The grammar state of a new request with ``params.structured_outputs`` (``processor``: the engine's
    ``InputProcessor``, which keeps one ``StructuredOutputManager``, built with the first such request).

    Raises:
        ValueError: with worker processes (the grammar state lives in the engine; the workers' samplers mask).
        VLLMValidationError: without a tokenizer (``structured_outputs``), or what the manager raises.
    """
    if processor.config.uses_worker_processes:
        raise ValueError("structured_outputs is not supported with worker processes (tensor_parallel_size > 1, "
                         "async_scheduling or distributed_executor_backend='mp')")
    if processor.structured_output_manager is None:
        if processor.tokenizer is None:
            raise VLLMValidationError("structured_outputs needs a tokenizer (the model has none): the grammar is "
                                      "compiled against the tokenizer's vocabulary", parameter="structured_outputs")
        processor.structured_output_manager = StructuredOutputManager(
            processor.tokenizer, processor.vocab_size, processor.eos_token_id,
            processor.config.structured_outputs_config)
    return processor.structured_output_manager.new_request(params.structured_outputs)



def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed bitmask: [rows, ceil(V / 32)] int32 of -1 (every bit set)."""
    return torch.full((rows, -(-vocab_size // 32)), -1, dtype=torch.int32)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Set to -inf, in place, the logits of the tokens whose bit is clear: ``logits[rows[i]]`` by
    ``bitmask[i]`` (xgrammar's CPU kernel). logits: [R, V] float32; bitmask: [len(rows), ceil(V / 32)] int32."""
    import xgrammar as xgr

    if len(rows) == logits.shape[0] and rows == list(range(len(rows))):
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[1])
        return
    full = new_bitmask(logits.shape[0], logits.shape[1])
    full[rows] = bitmask
    xgr.apply_token_bitmask_inplace(logits, full, vocab_size=logits.shape[1], indices=list(rows))


def allowed_count(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Allowed tokens per row of a bitmask ([R, W] int32 -> [R] int64), counting ids < ``vocab_size`` only."""
    bits = torch.arange(32, dtype=torch.int32)
    unpacked = (bitmask[:, :, None] >> bits) & 1  # [R, W, 32]
    return unpacked.reshape(bitmask.shape[0], -1)[:, :vocab_size].sum(-1)


# ---- teaching: what the mask costs, replayed after the fact ----------------------------------------------------
@dataclass(frozen=True)
class MaskStep:
    """The mask before one output token.

    Attributes:
        index: the output position (0 = the first generated token).
        num_allowed: tokens the mask allows; vocab_size: the logits width (their ratio is the allowed share).
        fill_seconds: median wall seconds of the first ``fill_next_token_bitmask`` at this state over the replays.
    """

    index: int
    num_allowed: int
    vocab_size: int
    fill_seconds: float

    @property
    def allowed_share(self) -> float:
        return self.num_allowed / self.vocab_size


@dataclass(frozen=True)
class MaskProfile:
    """``mask_profile``'s result: one ``MaskStep`` per output token, and how it was measured."""

    steps: list[MaskStep]
    repeats: int
    torch_threads: int
    load_average: tuple[float, float, float]


def mask_profile(manager: StructuredOutputManager, so: StructuredOutputsParams, output_token_ids: list[int],
                 repeats: int = 7) -> MaskProfile:
    """Replay a finished request's output through fresh grammar states and measure, before each token, how many
    tokens the mask allows and how long filling it takes (the engine itself never reads a clock for this).

    Timing: xgrammar computes a state's mask at its first fill and serves repeated fills of the same state from a
    cache, so each of the ``repeats`` replays builds a fresh matcher and times the first fill at every position;
    the median over the replays is kept (after one untimed replay as warm-up). xgrammar fills on the calling
    thread; torch is pinned to 1 thread for the call; the 1/5/15-minute load average is recorded.

    Raises:
        ValueError: the constraint cannot be compiled, or ``output_token_ids`` is not a valid output of it.
    """
    import os

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bitmask = new_bitmask(1, manager.vocab_size)
        times: list[list[float]] = []
        counts: list[int] = []
        for replay in range(repeats + 1):
            state = manager.new_request(so)
            for i, token in enumerate(output_token_ids):
                if state.is_terminated():
                    break
                t0 = time.perf_counter()
                state.fill_bitmask(bitmask)
                dt = time.perf_counter() - t0
                if replay == 0:
                    counts.append(int(allowed_count(bitmask, manager.vocab_size)[0]))
                    times.append([])
                else:
                    times[i].append(dt)
                if not state.accept_token(token):
                    raise ValueError(f"output_token_ids[{i}] ({token}) is not allowed by the constraint")
        steps = [MaskStep(i, n, manager.vocab_size, statistics.median(t))
                 for i, (n, t) in enumerate(zip(counts, times))]
        return MaskProfile(steps, repeats, 1, os.getloadavg())
    finally:
        torch.set_num_threads(threads)

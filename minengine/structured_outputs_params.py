"""StructuredOutputsParams: one output constraint of a request (vLLM's class, names and checks).

Its own module because only a constrained request runs it: ``SamplingParams.structured_outputs`` holds one, and
``minengine.sampling_params`` re-exports both names.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from minengine.exceptions import VLLMValidationError, show
from minengine.value_checks import check_unicode

# the constraint fields of StructuredOutputsParams, exactly one of which a request sets (vLLM's list)
STRUCTURED_OUTPUT_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """One output constraint of a request (vLLM's ``StructuredOutputsParams``): exactly one of ``json`` (a JSON
    schema, a dict or its JSON text), ``regex``, ``choice`` (the output is one of these strings), ``grammar``
    (EBNF, xgrammar's dialect of GBNF), ``json_object=True`` (any JSON object or array) or ``structural_tag`` (a
    JSON string, vLLM's format). The engine compiles it into a token automaton (``worker/structured_output.py``,
    xgrammar) when the request is added, so a constraint the grammar engine cannot compile is a ``ValueError``
    naming the field there, before anything runs.

    Attributes:
        disable_any_whitespace: JSON without free whitespace between tokens (xgrammar's ``any_whitespace=False``).
        disable_additional_properties: objects of ``json`` take only the listed properties (``additionalProperties:
            false`` wherever the schema leaves it unset).
        whitespace_pattern: accepted for vLLM compatibility; the xgrammar backend rejects a non-None value (as
            vLLM's xgrammar backend does).

    Raises:
        VLLMValidationError: (a ``ValueError``) none or more than one constraint, or a field of the wrong type
            (naming it).
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in STRUCTURED_OUTPUT_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            _invalid("structured_outputs", f"structured_outputs must set exactly one of "
                     f"{', '.join(STRUCTURED_OUTPUT_KINDS)}, got {given or 'none'}")
        kind, value = given[0], getattr(self, given[0])
        ok = {"json": isinstance(value, (str, dict)), "regex": isinstance(value, str),
              "choice": isinstance(value, (list, tuple)) and bool(value) and all(isinstance(c, str) for c in value),
              "grammar": isinstance(value, str) and bool(value.strip()), "json_object": value is True,
              "structural_tag": isinstance(value, str)}[kind]
        if not ok or (kind == "json" and isinstance(value, str) and not value.strip()):
            want = {"json": "a JSON schema (dict or JSON text)", "regex": "a string",
                    "choice": "a non-empty list of strings", "grammar": "a non-empty EBNF string",
                    "json_object": "True (omit structured_outputs for unconstrained output)",
                    "structural_tag": "a JSON string"}[kind]
            _invalid(f"structured_outputs.{kind}", f"structured_outputs.{kind} must be {want}, got {show(value)}")
        if kind == "choice":
            self.choice = list(value)
        for i, text in enumerate(value if kind == "choice" else [value] if isinstance(value, str) else []):
            check_unicode(text, f"structured_outputs.{kind}" + (f"[{i}]" if kind == "choice" else ""))
        for name in ("disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                _invalid(f"structured_outputs.{name}",
                         f"structured_outputs.{name} must be a bool, got {show(getattr(self, name))}")
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            _invalid("structured_outputs.whitespace_pattern", f"structured_outputs.whitespace_pattern must be a "
                     f"string or None, got {show(self.whitespace_pattern)}")

    @property
    def kind(self) -> str:
        """Which constraint is set: one of ``STRUCTURED_OUTPUT_KINDS``."""
        return next(k for k in STRUCTURED_OUTPUT_KINDS if getattr(self, k) is not None)

    def all_constraints_none(self) -> bool:
        """vLLM's helper (always False here: construction requires one constraint)."""
        return all(getattr(self, k) is None for k in STRUCTURED_OUTPUT_KINDS)

    @classmethod
    def from_dict(cls, value: dict) -> StructuredOutputsParams:
        """From the JSON the OpenAI server receives (``{"json": {...}}``); an unknown key is a
        ``VLLMValidationError``."""
        if not isinstance(value, dict):
            _invalid("structured_outputs", f"structured_outputs must be an object, got {show(value)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            _invalid("structured_outputs", f"structured_outputs has unknown keys {show(unknown)} "
                     f"(known: {sorted(known)})")
        return cls(**value)


def _invalid(parameter: str, message: str):
    raise VLLMValidationError(message, parameter=parameter)

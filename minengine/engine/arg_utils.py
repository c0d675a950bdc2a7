"""EngineArgs and AsyncEngineArgs: vLLM's way to configure an engine, mapped onto ``EngineConfig``.

``EngineArgs`` has every ``EngineConfig`` field plus the vLLM fields minengine maps or accepts: a script
written for vLLM (``EngineArgs(model=..., gpu_memory_utilization=0.8)``, ``EngineArgs.add_cli_args(parser)``,
``LLM(model, tensor_parallel_size=1, enforce_eager=True)``) runs unchanged. ``create_engine_config()`` turns it
into a validated ``EngineConfig``:

=========================  ==================================================================================
vLLM field                 minengine
=========================  ==================================================================================
num_gpu_blocks_override    ``num_kv_blocks``
gpu_memory_utilization     ``EngineConfig.gpu_memory_utilization``: a KV budget, at most this fraction of the free
                           device / host memory (never more than the default pool)
swap_space (GiB)           ``swap_space_bytes`` (used by ``preemption_mode="swap"``)
scheduling_policy="fcfs"   ``"decode-first"`` (vLLM's FCFS serves running requests first); "priority" as is
dtype="auto"               float32 on the CPU; on CUDA the checkpoint's dtype (float16 for a float32 one);
                           "half" = float16, "float" = float32 (vLLM's aliases)
None for block_size, ...   the engine's default (vLLM's ``None`` defaults: block_size, max_num_batched_tokens,
                           max_num_seqs, enable_chunked_prefill, enable_prefix_caching; seed None or -1 = 0,
                           the seed vLLM V1 initializes)
tensor_parallel_size       ``EngineConfig.tensor_parallel_size`` (worker processes; also
                           ``distributed_executor_backend``, ``async_scheduling``, ``enable_expert_parallel``)
pipeline_parallel_size...  must be 1; cpu_offload_gb 0
quantization               ``EngineConfig.quantization``: None or "int8" (weight-only); "experts_int8" (vLLM's
                           name for the same per-output-channel int8 weights) is taken as "int8"
max_logprobs               ``EngineConfig.max_logprobs``: the most logprobs a request may ask for (-1: no cap)
kv_cache_dtype             ``EngineConfig.kv_cache_dtype``: "auto", "fp8" or "fp8_e4m3"
attention_backend          ``EngineConfig.attention_backend``: "auto", "reference", "cpu" or "triton"
disable_log_stats          ``EngineConfig.disable_log_stats``: no Prometheus updates per step
enforce_eager              ``EngineConfig.enforce_eager``: True = eager; False = decode steps compiled
                           (``torch.compile``) where that applies; None (default) = eager (compiling
                           is asked for: the first decode step pays it)
disable_custom_all_reduce  accepted, no effect (and max_seq_len_to_capture)
=========================  ==================================================================================
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import typing
from pathlib import Path

from minengine.config import EngineConfig
from minengine.exceptions import VLLMValidationError, show

# vLLM fields with no minengine counterpart: name -> (type, default, the only value(s) allowed or None = any, help)
_VLLM_ONLY: dict[str, tuple[type, object, tuple | None, str]] = {
    "pipeline_parallel_size": (int, 1, (1,), "must be 1: minengine runs on one device"),
    "data_parallel_size": (int, 1, (1,), "must be 1: one engine per process"),
    "num_gpu_blocks_override": (int, None, None, "KV blocks in the pool (= num_kv_blocks)"),
    "swap_space": (float, None, None, "CPU swap space in GiB for preemption_mode=swap (None: num_kv_blocks)"),
    "disable_custom_all_reduce": (bool, False, None, "accepted; no effect"),
    "max_seq_len_to_capture": (int, None, None, "accepted; no effect"),
    "tokenizer_mode": (str, "auto", ("auto",), "must be 'auto'"),
    "tokenizer_revision": (str, None, None, "hub revision of the tokenizer (None: revision)"),
    "cpu_offload_gb": (float, 0, (0,), "must be 0"),
    "generation_config": (str, "auto", ("auto", "vllm"), "'auto': sampling defaults from the checkpoint's "
                          "generation_config.json; 'vllm': SamplingParams() defaults"),
}
_SCHEDULING_ALIASES = {"fcfs": "decode-first"}
_DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's names for them
# vLLM fields whose default is None, meaning "the engine's default" (and seed -1: no seed of one's own)
_NONE_MEANS_DEFAULT = ("block_size", "max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill",
                       "enable_prefix_caching", "seed")
_CONFIG_FIELDS = [f for f in dataclasses.fields(EngineConfig) if f.name != "extra"]
_CONFIG_DEFAULTS = {f.name: f.default for f in _CONFIG_FIELDS if f.default is not dataclasses.MISSING}
# Command-line choices; the lists live here so that every command (run, generate, serve, bench-serve) shares them
_BOOL_ALIASES = {"enable_chunked_prefill": "--chunked-prefill", "enable_prefix_caching": "--prefix-caching"}
_HELP_OVERRIDES = {"model": "HF checkpoint directory or hub id (None: the bundled tiny model)"}


def _cli_choices() -> dict[str, tuple]:
    from minengine.config import ATTENTION_BACKENDS, KV_CACHE_DTYPES, QUANTIZATIONS
    from minengine.core.policies import POLICIES
    from minengine.core.scheduler_config import PREEMPTION_MODES

    return {"dtype": ("auto", "float32", "float16", "bfloat16", *_DTYPE_ALIASES), "device": ("cpu", "cuda", "auto"),
            "scheduling_policy": (*POLICIES, *_SCHEDULING_ALIASES), "preemption_mode": PREEMPTION_MODES,
            "kv_cache_dtype": KV_CACHE_DTYPES, "attention_backend": ATTENTION_BACKENDS, "quantization": QUANTIZATIONS}


def _field_docs() -> dict[str, str]:
    """Each ``EngineConfig`` field's description, from the "Attributes:" section of its docstring."""
    docs: dict[str, str] = {}
    name = None
    lines = (EngineConfig.__doc__ or "").split("Attributes:", 1)[-1].split("Raises:", 1)[0].splitlines()
    for line in lines:
        head = re.match(r"^ {8}(\w+): (.*)$", line)
        if head:
            name = head.group(1)
            docs[name] = head.group(2).strip()
        elif name and line.startswith(" " * 12):
            docs[name] += " " + line.strip()
    # the formatter appends "(default: X)" itself: drop the docstring's own mentions so none shows twice
    return {k: v.replace("``", "").replace(" (default)", "").replace("(default, ", "(").replace("%", "%%")
            for k, v in docs.items()}


def _optional(kind):
    """An argparse type for an ``X | None`` field: "none" gives None."""
    def parse(text: str):
        return None if text.strip().lower() == "none" else kind(text)
    parse.__name__ = kind.__name__
    return parse


def _json_object(text: str) -> dict:
    """A JSON object from the command line (argparse reports the ValueError as a usage error)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return value


class _LabAction(argparse.Action):
    """``--lab NAME=PATH``, repeatable: adds ``NAME: PATH`` to the ``labs`` dict (argparse reports a bad value)."""

    def __call__(self, parser, namespace, value, option_string=None):
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise argparse.ArgumentError(self, f"expected NAME=PATH (a lab name and the learner's file), got {value!r}")
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), name.strip(): path.strip()})


def _resolve_auto_dtype(model: str | None, device: str) -> str:
    """vLLM's dtype="auto": the checkpoint's dtype on a GPU (float16 for a float32 checkpoint); float32 on the
    CPU, where minengine is exact against transformers."""
    import torch

    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return "float32"
    config = {}
    if model is not None and (Path(model) / "config.json").is_file():
        config = json.loads((Path(model) / "config.json").read_text())
    elif model is not None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model).to_dict()
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32").replace("torch.", "")
    return dtype if dtype in ("float16", "bfloat16") else "float16"


def _fields() -> list[tuple[str, object, dataclasses.Field]]:
    out = [(f.name, f.type, dataclasses.field(default=f.default) if f.default is not dataclasses.MISSING
            else dataclasses.field(default_factory=f.default_factory)) for f in _CONFIG_FIELDS]
    out += [(name, f"{t.__name__} | None", dataclasses.field(default=default))
            for name, (t, default, _, _) in _VLLM_ONLY.items()]
    return out


class _EngineArgsMethods:
    """The methods of ``EngineArgs`` (its fields are generated from ``EngineConfig`` and ``_VLLM_ONLY``)."""

    def create_engine_config(self) -> EngineConfig:
        """The validated ``EngineConfig`` these arguments describe.

        Raises:
            ValueError: naming the field, for a vLLM setting minengine cannot honour (``pipeline_parallel_size``
                != 1, a quantization...) or any invalid ``EngineConfig`` value.
        """
        for name, (_, _, allowed, why) in _VLLM_ONLY.items():
            if allowed is not None and getattr(self, name) not in allowed:
                raise VLLMValidationError(f"{name}={show(getattr(self, name))} is not supported: {why}")
        kwargs = {f.name: getattr(self, f.name) for f in _CONFIG_FIELDS}
        for name in _NONE_MEANS_DEFAULT:
            if kwargs[name] is None or (name == "seed" and kwargs[name] == -1):
                kwargs[name] = _CONFIG_DEFAULTS[name]
        kwargs["dtype"] = _DTYPE_ALIASES.get(self.dtype, self.dtype)
        if self.num_gpu_blocks_override is not None:
            kwargs["num_kv_blocks"] = self.num_gpu_blocks_override
        if self.swap_space is not None:
            if not isinstance(self.swap_space, (int, float)) or isinstance(self.swap_space, bool) \
                    or not self.swap_space > 0:
                raise VLLMValidationError(f"swap_space must be a number of GiB > 0, got {show(self.swap_space)}")
            kwargs["swap_space_bytes"] = int(self.swap_space * 2**30)
        kwargs["scheduling_policy"] = _SCHEDULING_ALIASES.get(self.scheduling_policy, self.scheduling_policy)
        if self.dtype == "auto":
            kwargs["dtype"] = _resolve_auto_dtype(self.model, self.device)
        return EngineConfig(**kwargs)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one flag per field to ``parser`` (a parser or an argument group) and return it: vLLM's flag names
        (``--max-num-batched-tokens`` for ``max_num_batched_tokens``), types, choices, defaults and help (an
        ``EngineConfig`` field's from its docstring). Booleans are ``--flag`` / ``--no-flag`` (also
        ``--chunked-prefill`` / ``--prefix-caching``); optional numbers take ``none``; ``--speculative-config``
        is vLLM's JSON. Fields holding objects (``logits_processors``, ``output_length_predictor``) are not
        command-line settings. This is the one definition every command uses (run, generate, serve,
        bench-serve)."""
        is_group = isinstance(parser, argparse._ArgumentGroup)
        group = parser if is_group else parser.add_argument_group(f"engine ({cls.__name__}, vLLM's names)")
        docs, choices = _field_docs(), _cli_choices()
        hints = typing.get_type_hints(EngineConfig)
        for f in dataclasses.fields(cls):
            if f.name == "speculative_config":
                group.add_argument("--speculative-config", dest=f.name, type=_json_object, default=None,
                                   metavar="JSON", help='speculative decoding by prompt lookup, vLLM\'s JSON: '
                                   '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
                                   '"prompt_lookup_min": 2}\'; None = off')
                continue
            if f.name == "structured_outputs_config":
                group.add_argument("--structured-outputs-config", dest=f.name, type=_json_object, default=None,
                                   metavar="JSON", help='structured outputs, vLLM\'s JSON: \'{"backend": "auto", '
                                   '"disable_any_whitespace": false, "disable_additional_properties": false}\' '
                                   '(backend: auto, xgrammar or guidance)')
                continue
            if f.name == "labs":
                group.add_argument("--lab", "--labs", dest=f.name, action=_LabAction, default=None, metavar="NAME=PATH",
                                   help="run the engine on a part a learner wrote: a lab's name and the learner's file "
                                   "(or module), repeatable, e.g. --lab block_pool=labs/block_pool/block_pool.py "
                                   "(labs/README.md)")
                continue
            if f.name in _VLLM_ONLY:
                kind, _, _, help_text = _VLLM_ONLY[f.name]
                optional = True
            else:
                hint = hints.get(f.name, f.type)
                args = typing.get_args(hint)
                optional = type(None) in args or f.name in _NONE_MEANS_DEFAULT  # vLLM's None defaults
                kind = next((a for a in args if a is not type(None)), hint) if args else hint
                help_text = _HELP_OVERRIDES.get(f.name, docs.get(f.name, f"EngineConfig.{f.name}"))
            if kind not in (bool, int, float, str):
                continue  # an object or a container: not a command-line setting
            flags = ["--" + f.name.replace("_", "-")] + ([_BOOL_ALIASES[f.name]] if f.name in _BOOL_ALIASES else [])
            default = f.default if f.default is not dataclasses.MISSING else None
            if kind is bool:
                group.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                                   help=help_text)
                continue
            group.add_argument(*flags, dest=f.name, type=_optional(kind) if optional else kind, default=default,
                               choices=choices.get(f.name), help=help_text,
                               metavar=None if f.name in choices else kind.__name__.upper())
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        """The arguments from a parsed command line (the attributes ``add_cli_args`` defined)."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})


EngineArgs = dataclasses.make_dataclass("EngineArgs", _fields(), bases=(_EngineArgsMethods,), kw_only=True)
EngineArgs.__module__ = __name__
EngineArgs.__doc__ = (
    "vLLM's ``EngineArgs``: every ``EngineConfig`` field (same names and defaults) plus the vLLM fields in the "
    "table of ``minengine.engine.arg_utils``. ``create_engine_config()`` validates and maps them; "
    "``add_cli_args`` / ``from_cli_args`` build them from a command line; "
    "``LLMEngine.from_engine_args(args)`` builds an engine.")


@dataclasses.dataclass(kw_only=True)
class AsyncEngineArgs(EngineArgs):
    """vLLM's ``AsyncEngineArgs``: ``EngineArgs`` for ``AsyncLLMEngine.from_engine_args`` (plus vLLM's
    request-logging switch, accepted with no effect)."""

    disable_log_requests: bool = True

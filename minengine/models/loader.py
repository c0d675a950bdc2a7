"""Load a Hugging Face checkpoint (local directory or hub id) into minengine's model classes."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from minengine.distributed import TensorParallelGroup
from minengine.models.layer_windows import layer_windows
from minengine.models.llama import LlamaForCausalLM
from minengine.models.registry import ModelSpec, model_spec

logger = logging.getLogger(__name__)

_WEIGHT_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def resolve_model_path(model: str, revision: str | None = None) -> Path:
    """A local checkpoint directory as is; anything else is a hub id, downloaded (weights, config and
    tokenizer files only, at ``revision``: a branch, tag or commit; None = the default branch) into the
    Hugging Face cache with ``huggingface_hub.snapshot_download``.

    Raises:
        ValueError: the path does not exist and is not a valid hub id, or the download fails.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise ValueError(f"model {model!r} is not a checkpoint directory")
    from huggingface_hub import snapshot_download

    try:
        extra = {"revision": revision} if revision is not None else {}
        return Path(snapshot_download(repo_id=model, allow_patterns=_WEIGHT_PATTERNS, **extra))
    except Exception as exc:  # network, auth, unknown repo: one clear message
        raise ValueError(f"model {model!r}: not a local directory, and downloading it from the hub failed: {exc}") \
            from exc


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (``*.safetensors``, or ``pytorch_model*.bin`` as a fallback).

    Raises:
        ValueError: no weight files, or a file that is not a readable safetensors / torch file (named).
    """
    files = sorted(path.glob("*.safetensors"))
    if files:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        state = {}
        for f in files:
            try:
                state.update(load_file(str(f)))
            except (SafetensorError, OSError, ValueError) as exc:  # truncated, corrupt or unreadable
                raise ValueError(f"{f}: not a valid safetensors file ({exc})") from None
        return state
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise ValueError(f"no *.safetensors or pytorch_model*.bin weights in {path}")
    state = {}
    for f in bins:
        try:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
        except (pickle.UnpicklingError, EOFError, RuntimeError, OSError, ValueError) as exc:
            raise ValueError(f"{f}: not a valid PyTorch weights file ({exc})") from None
    return state


def load_config(path: Path, trust_remote_code: bool = False):
    """The checkpoint's ``config.json`` as a transformers config. Raises ``ValueError`` naming the file when
    it is missing, not JSON, or not a model config (transformers raises OSError, ValueError or TypeError)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers reports bad configs with many exception types
        raise ValueError(f"{path / 'config.json'}: not a valid model config ({type(exc).__name__}: {exc})") \
            from None


def check_model_config(hf_config, path: Path, tensor_parallel_size: int = 1,
                       quantization: str | None = None, expert_parallel: bool = False) -> ModelSpec:
    """The ``ModelSpec`` of a supported config (``models/registry.py``); builds the model on the meta device (no
    memory) to check that the config's sizes make one.

    Raises:
        ValueError: unknown architecture, a malformed sliding window (``layer_windows``), a window on a
            mixture-of-experts model, sizes that build no model, a ``tensor_parallel_size`` > 1 or a
            ``quantization`` the architecture does not support; ``expert_parallel`` on a dense model, or with
            experts that do not divide by ``tensor_parallel_size`` (each naming ``enable_expert_parallel``).
    """
    spec = model_spec(hf_config)
    model_type = hf_config.model_type
    if not spec.windowed_attention and (getattr(hf_config, "use_sliding_window", False) or (
            model_type == "mixtral" and getattr(hf_config, "sliding_window", None))):
        raise ValueError(f"sliding-window attention is not supported for {model_type} models (minengine's "
                         "windowed attention covers dense models)")
    if expert_parallel:
        _check_expert_parallel(hf_config, spec, tensor_parallel_size)
    elif tensor_parallel_size > 1 and not spec.tensor_parallel:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size} on a {model_type} model needs "
                         f"enable_expert_parallel=True (minengine splits a mixture-of-experts model's experts "
                         f"across ranks; it does not shard each expert's weights)")
    if quantization is not None and not spec.quantizable:
        raise ValueError(f"quantization={quantization!r} is not supported for {model_type} models (int8 covers "
                         f"linear layers; a mixture-of-experts model's experts would stay unquantized)")
    _build_on_meta(hf_config, path, spec, None)
    return spec


def _check_expert_parallel(hf_config, spec: ModelSpec, tensor_parallel_size: int) -> None:
    """``enable_expert_parallel`` needs a MoE architecture whose experts divide by the ranks (ValueError)."""
    if not spec.expert_parallel:
        raise ValueError(f"enable_expert_parallel=True needs a mixture-of-experts model; {hf_config.model_type} "
                         f"is dense (it has no experts to split)")
    from minengine.layers.expert_parallel import check_expert_split
    from minengine.models.moe import moe_settings

    check_expert_split(moe_settings(hf_config).num_experts, tensor_parallel_size)


class _SkipInit(TorchFunctionMode):
    """``torch.nn.init``'s fills do nothing: the weights come from the checkpoint. On the meta device a fill
    would only cost time: ``normal_`` goes through ``torch._refs``, whose first call imports ``torch._dynamo``
    (~6 s of a process's start on this project's loaded machine)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def model_class(hf_config, spec: ModelSpec | None = None) -> type[LlamaForCausalLM]:
    """The class a config builds: its ``ModelSpec``'s (``models/registry.py``), or ``WindowedLlamaForCausalLM``
    (``models/windowed_llama.py``) when any layer attends through a sliding window (``layer_windows``; raises
    ``ValueError`` as it does, and as ``model_spec`` does for an unknown architecture)."""
    spec = spec or model_spec(hf_config)
    if all(window is None for window in layer_windows(hf_config)):
        return spec.model_cls()
    from minengine.models.windowed_llama import WindowedLlamaForCausalLM

    return WindowedLlamaForCausalLM


def _build_on_meta(hf_config, path: Path, spec: ModelSpec, tp: TensorParallelGroup | None,
                   expert_parallel: bool = False) -> LlamaForCausalLM:
    cls = model_class(hf_config, spec)  # a malformed window is reported as is, before the sizes are tried
    extra = {"expert_parallel": True} if expert_parallel else {}  # only MoE classes take it
    try:
        with torch.device("meta"), _SkipInit():
            return cls(hf_config, qkv_bias=spec.qkv_bias, qk_norm=spec.qk_norm, tp=tp, **extra)
    except (ArithmeticError, ValueError, TypeError, RuntimeError) as exc:  # e.g. 0 attention heads
        raise ValueError(f"{path / 'config.json'}: cannot build a {hf_config.model_type} model from it "
                         f"({type(exc).__name__}: {exc})") from None


def shard_state_dict(net: LlamaForCausalLM, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint's full tensors cut to the shard of ``net``'s rank: every tensor of a layer with a
    ``shard_weight`` (``layers/linear.py``) is replaced by a copy of its slice (a copy, so the full tensor can
    be freed); replicated tensors (embeddings, norms) stay as they are."""
    out = {}
    for name, tensor in state.items():
        module_name, _, param = name.rpartition(".")
        try:
            module = net.get_submodule(module_name)
        except AttributeError:  # not a module of the model: load_state_dict reports it as unexpected
            module = None
        shard = getattr(module, "shard_weight", None)
        out[name] = shard(param, tensor).clone() if shard is not None else tensor
    return out


def load_model(model: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
               revision: str | None = None, trust_remote_code: bool = False,
               quantization: str | None = None, tp: TensorParallelGroup | None = None,
               hf_config=None, expert_parallel: bool = False) -> tuple[LlamaForCausalLM, object, Path]:
    """Build the model for a checkpoint and load its weights (``revision``, ``trust_remote_code``: as
    transformers', for the hub download and the config; ``quantization="int8"``: the decoder's linear layers
    quantized to int8 weights once loaded, ``layers/quantization.py``).

    ``tp``: a ``TensorParallelGroup`` of world size > 1 loads this rank's shard (``shard_state_dict``); a tied
    LM head is then a view of the rank's vocabulary rows of the (replicated) embedding. None = the whole model.
    ``hf_config``: the checkpoint's config when the caller has read it already (a worker gets the driver's).
    ``expert_parallel``: a MoE model's experts split over ``tp``'s ranks (``layers/expert_parallel.py``).

    Returns:
        (model in eval mode on ``device`` with ``dtype`` parameters, the transformers config, the local path).
    Raises:
        ValueError: unknown architecture, a malformed sliding window, a missing or garbled ``config.json``,
            unreadable weight files, weights that do not match the config (the file named), an unknown
            ``quantization``, or a ``quantization`` / ``tp`` of more than one rank the architecture does not
            support (``models/registry.py``: MoE models), ``expert_parallel`` as ``check_model_config`` refuses it.
    """
    if quantization is not None:
        from minengine.layers.quantization import QUANTIZATION_METHODS

        if quantization not in QUANTIZATION_METHODS:  # before any loading work
            raise ValueError(f"quantization must be one of {(None, *QUANTIZATION_METHODS)}, got {quantization!r}")
    path = resolve_model_path(model, revision)
    if hf_config is None:
        hf_config = load_config(path, trust_remote_code)
    spec = check_model_config(hf_config, path, tp.world_size if tp is not None else 1, quantization,
                              expert_parallel)
    model_type = hf_config.model_type
    net = _build_on_meta(hf_config, path, spec, tp, expert_parallel)
    sharded = tp is not None and tp.world_size > 1
    state = {k: v for k, v in load_state_dict(path).items() if not k.endswith("rotary_emb.inv_freq")}
    state = spec.convert(state, hf_config)
    tied = getattr(hf_config, "tie_word_embeddings", False) or "lm_head.weight" not in state
    if tied:
        state.pop("lm_head.weight", None)
    if sharded:
        state = shard_state_dict(net, state)
    try:
        missing, unexpected = net.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:  # tensor shapes that do not match the config
        raise ValueError(f"checkpoint {path}: weights do not match config.json ({exc})") from None
    missing = [k for k in missing if not (tied and k == "lm_head.weight") and not k.startswith("rotary.")]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match a {model_type} model: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    if tied and sharded:  # this rank's vocabulary rows of the embedding, shared (a view, no copy)
        head = net.lm_head
        net.lm_head.weight = torch.nn.Parameter(net.model.embed_tokens.weight.narrow(0, head.vocab_start,
                                                                                      head.out_features))
    elif tied:
        net.lm_head.weight = net.model.embed_tokens.weight
    net.rotary = type(net.rotary)(hf_config)  # its buffer was built on the meta device
    net = net.to(device=device, dtype=dtype).eval()
    net.rotary.inv_freq = net.rotary.inv_freq.float()  # keep RoPE frequencies in float32 at any dtype
    if quantization is not None:
        from minengine.layers.quantization import quantize_model

        quantize_model(net, quantization)
    return net, hf_config, path


def load_tokenizer(path: Path | str, required: bool = False, revision: str | None = None,
                   trust_remote_code: bool = False):
    """The tokenizer at ``path`` via ``transformers.AutoTokenizer`` (``revision`` for a hub id). When the
    checkpoint has no tokenizer files, None (the engine then takes prompts as token ids only), or, when
    ``required`` (the user named a tokenizer) or the directory has tokenizer files that do not load (corrupt),
    a ``ValueError``."""
    from transformers import AutoTokenizer

    has_files = Path(path).is_dir() and any((Path(path) / name).exists() for name in _TOKENIZER_FILES)
    try:
        return AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    except Exception as exc:  # OSError, ValueError, TypeError, or the tokenizers library's own Exception
        if required or has_files:
            raise ValueError(f"tokenizer {str(path)!r} could not be loaded: {exc}") from None
        logger.info("no tokenizer for %s (%s): prompts must be given as token ids", path, exc)
        return None

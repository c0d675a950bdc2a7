"""Which decoder layers attend through a sliding window, read from a checkpoint's config (no torch).

Idea: sliding-window attention (Longformer, Beltagy et al. 2020; Mistral 7B, Jiang et al. 2023): a token attends
to itself and the ``window - 1`` tokens before it, so a layer's keys older than that are never read again. With
transformers' mask (``masking_utils.sliding_window_overlay``), query position q sees key position k when
``q - window < k <= q``.

The configs say it in two ways, and this module reads each as the installed transformers' model does:

- Mistral (``model_type == "mistral"``): every layer has the window ``sliding_window`` (None = full attention;
  ``MistralModel`` ignores a ``layer_types`` list).
- Qwen2 and Qwen3: ``layer_types``, one ``"full_attention"`` or ``"sliding_attention"`` per layer; the config
  builds it from ``use_sliding_window`` and ``max_window_layers`` (layers from ``max_window_layers`` on are
  windowed) and sets ``sliding_window`` to None unless ``use_sliding_window``.

Llama configs have no window.
"""

from __future__ import annotations

WINDOWED_BY_LAYER_TYPES = ("qwen2", "qwen3")
LAYER_TYPES = ("full_attention", "sliding_attention")


def layer_windows(hf_config) -> list[int | None]:
    """The window of each decoder layer in tokens (None = full attention), one entry per layer.

    Raises:
        ValueError: a window that is not a positive integer; a ``layer_types`` entry that is neither
            "full_attention" nor "sliding_attention", or a list whose length is not ``num_hidden_layers``.
    """
    num_layers = getattr(hf_config, "num_hidden_layers", 0)
    model_type = getattr(hf_config, "model_type", None)
    window = getattr(hf_config, "sliding_window", None)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding_window must be a positive integer or None, got {window!r}")
    if model_type == "mistral":
        return [window] * num_layers
    layer_types = getattr(hf_config, "layer_types", None)
    if model_type not in WINDOWED_BY_LAYER_TYPES or layer_types is None or window is None:
        return [None] * num_layers
    if len(layer_types) != num_layers or any(t not in LAYER_TYPES for t in layer_types):
        raise ValueError(f"layer_types must list {num_layers} entries of {LAYER_TYPES}, got {layer_types!r}")
    return [window if t == "sliding_attention" else None for t in layer_types]


def kv_window(hf_config) -> int | None:
    """The window one block table for every layer may drop blocks by: the largest layer window when every layer
    is windowed (``core/windowed_kv_cache_manager.py``), else None. A block can be freed only once it is outside
    every layer's window that reads it: under one table a single full-attention layer reads every key, so a model
    that mixes full and windowed layers gets two KV cache groups instead, each with its own block table
    (``hybrid_window``, ``core/hybrid_kv_cache_manager.py``), and the windowed group frees by its window."""
    windows = layer_windows(hf_config)
    if not windows or any(w is None for w in windows):
        return None
    return max(windows)


def hybrid_window(hf_config) -> int | None:
    """The window of the windowed KV cache group of a model that mixes full-attention and windowed layers (the
    largest windowed layer's window), else None (no windowed layer, or every layer windowed: ``kv_window``).

    Raises:
        ValueError: as ``layer_windows``.
    """
    windows = [w for w in layer_windows(hf_config) if w is not None]
    if not windows or len(windows) == getattr(hf_config, "num_hidden_layers", 0):
        return None
    return max(windows)

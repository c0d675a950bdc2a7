"""app.py on a model with two KV cache groups (a Qwen2 with a full-attention and a windowed layer, the bundled
tokenizer): the block view draws each group's pool, and a comparison the model refuses (swap preemption) is a
message naming the field, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from minengine.config import BUNDLED_MODEL  # noqa: E402
from tests.conftest import _save_random_model  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "app.py"


@pytest.fixture(scope="module")
def mixed_model(tmp_path_factory) -> str:
    from transformers import Qwen2Config

    if not (Path(BUNDLED_MODEL) / "tokenizer.json").exists():
        pytest.skip("bundled model missing: run scripts/train_tiny_model.py")
    vocab_size = json.loads((Path(BUNDLED_MODEL) / "config.json").read_text())["vocab_size"]
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                      use_sliding_window=True, sliding_window=32, max_window_layers=1, bos_token_id=0,
                      eos_token_id=0, tie_word_embeddings=True)
    out = Path(_save_random_model(cfg, tmp_path_factory.mktemp("mixed-dashboard"), seed=1))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(BUNDLED_MODEL) / name, out / name)
    return str(out)


def test_the_block_view_draws_both_kv_cache_groups(mixed_model, monkeypatch):
    monkeypatch.setenv("MINENGINE_MODEL", mixed_model)
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    at.selectbox(key="preset_en").set_value("c").run()  # the preset without prefix caching
    at.button(key="run").click().run()
    at.button(key="live_finish").click().run()
    assert not at.exception, at.exception
    titles = [json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "") for c in at.get("plotly_chart")]
    full = [x for x in titles if x.startswith("Full-attention layers' KV cache group: KV block pool at step")]
    windowed = [x for x in titles if x.startswith("Sliding-window layers' KV cache group: KV block pool at step")]
    assert len(full) == len(windowed) == 1, titles
    # the A/B tab's swap-preemption run is refused by the engine: one message naming the field
    assert [e.value for e in at.error] == [
        "The engine refused this run: preemption_mode='swap' is not supported with sliding-window attention "
        "(the model's sliding_window is 32): use preemption_mode='recompute'"]

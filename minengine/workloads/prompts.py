"""Prompt sets: built-in Shakespeare openings, and real user prompts from ``shared/data/prompts/``."""

from __future__ import annotations

import json
import os
from pathlib import Path

SHAKESPEARE_OPENINGS = [
    "ROMEO:\nBut, soft! what light through yonder window breaks?\n",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n",
    "HAMLET:\nTo be, or not to be, that is the question:\n",
    "KING RICHARD III:\nNow is the winter of our discontent\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "MENENIUS:\nWhat work's, my countrymen, in hand? where go you\n",
    "PORTIA:\nThe quality of mercy is not strain'd,\n",
    "DUKE VINCENTIO:\nOf government the properties to unfold,\n",
    "LADY MACBETH:\nThe raven himself is hoarse\n",
    "GLOUCESTER:\nNow, my lord, what shall we do?\n",
    "BRUTUS:\nFriends, Romans, countrymen, lend me your ears;\n",
    "KING LEAR:\nBlow, winds, and crack your cheeks! rage! blow!\n",
    "PROSPERO:\nWe are such stuff\nAs dreams are made on,\n",
    "MERCUTIO:\nA plague o' both your houses!\n",
    "QUEEN MARGARET:\n",
    "CORIOLANUS:\n",
]


def find_data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The ``shared/data`` folder: ``explicit`` if given, else ``$MINENGINE_DATA``, else ``../shared/data``
    next to the working directory or next to the repository. None when none exists."""
    candidates = [explicit, os.environ.get("MINENGINE_DATA"), Path.cwd().parent / "shared" / "data",
                  Path(__file__).resolve().parents[3] / "shared" / "data"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return None


def load_real_prompts(data_dir: Path | None, limit: int, max_chars: int = 2000) -> list[str]:
    """Up to ``limit`` real user prompts: MT-Bench first turns, then Arena-Hard prompts, each cut to
    ``max_chars`` characters. Empty when the files are absent."""
    if data_dir is None:
        return []
    out: list[str] = []
    mt = data_dir / "prompts" / "mt_bench_question.jsonl"
    arena = data_dir / "prompts" / "arena_hard_v0.1_question.jsonl"
    if mt.exists():
        out += [json.loads(line)["turns"][0] for line in mt.read_text().splitlines() if line.strip()]
    if arena.exists():
        out += [json.loads(line)["prompt"] for line in arena.read_text().splitlines() if line.strip()]
    return [p[:max_chars] for p in out[:limit]]

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


def _read_prompts(path: Path, pick) -> list[str]:
    """The prompt of every line of a JSON Lines file; ``pick(obj)`` returns it or None when the line does not
    have the expected shape. Raises ``ValueError`` naming the file and line for anything else."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    out = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: line {line_no}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise ValueError(f"{path}: line {line_no}: JSON nested too deeply to parse") from None
        prompt = pick(obj) if isinstance(obj, dict) else None
        if not isinstance(prompt, str):
            raise ValueError(f"{path}: line {line_no}: expected {pick.__doc__}, got {line[:80]!r}")
        out.append(prompt)
    return out


def _mt_bench_turn(obj):
    """an object with 'turns', a non-empty list of strings"""
    turns = obj.get("turns")
    return turns[0] if isinstance(turns, list) and turns else None


def _arena_prompt(obj):
    """an object with a string 'prompt'"""
    return obj.get("prompt")


def load_real_prompts(data_dir: Path | None, limit: int, max_chars: int = 2000) -> list[str]:
    """Up to ``limit`` real user prompts: MT-Bench first turns, then Arena-Hard prompts, each cut to
    ``max_chars`` characters. Empty when the files are absent.

    Raises:
        ValueError: a file that is not UTF-8 JSON Lines of the expected shape (file and line named).
    """
    if data_dir is None:
        return []
    out: list[str] = []
    mt = data_dir / "prompts" / "mt_bench_question.jsonl"
    arena = data_dir / "prompts" / "arena_hard_v0.1_question.jsonl"
    if mt.exists():
        out += _read_prompts(mt, _mt_bench_turn)
    if arena.exists():
        out += _read_prompts(arena, _arena_prompt)
    return [p[:max_chars] for p in out[:limit]]

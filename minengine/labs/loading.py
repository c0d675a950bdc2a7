"""Loading a learner's part: a file anywhere on disk (a fresh module each time) or an importable module name."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

from minengine.labs.check import LabFailure, learner_files, where_raised

_load_count = itertools.count()


def _is_path(source: str | Path) -> bool:
    return isinstance(source, Path) or source.endswith(".py") or "/" in source or "\\" in source


def load_submission(source: str | Path | ModuleType) -> ModuleType:
    """The learner's module: ``source`` itself (a module), a ``.py`` file (loaded under a new unique module name
    at every call, so two submissions never share state), or an importable module name.

    Raises:
        LabFailure: the file is missing, or it (or what it imports) does not import: a syntax error or the
            exception raised, with the file and line.
    """
    if isinstance(source, ModuleType):
        return source
    if not isinstance(source, (str, Path)):
        raise LabFailure(f"a submission is a file path, a module name or a module, got {type(source).__name__}")
    if not _is_path(source):
        try:
            return importlib.import_module(source)
        except Exception as error:
            raise LabFailure(f"module {source!r} does not import: {_where(error, ())}") from None
    path = Path(source).expanduser().resolve()
    if not path.is_file():
        raise LabFailure(f"submission file {str(path)!r} does not exist")
    name = f"minengine_lab_submission_{next(_load_count)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look a module up by name while it runs
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(name, None)
        raise LabFailure(f"{path} does not import: {_where(error, learner_files(path))}") from None
    return module


def _where(error: BaseException, files) -> str:
    """``error`` with the file and line it points at (a SyntaxError's own, else the line of the learner's file it
    came through: ``where_raised``)."""
    if isinstance(error, SyntaxError):
        return f"{type(error).__name__}: {error.msg} at {error.filename}:{error.lineno}: {(error.text or '').strip()}"
    return f"{type(error).__name__}: {error} at {where_raised(error, files)}"

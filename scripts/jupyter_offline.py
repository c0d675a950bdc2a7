"""Keep the course's JupyterLab offline: switch off its news and update check (the
``@jupyterlab/apputils-extension:announcements`` plugin, which asks to fetch news from the internet on first start).

The setting is committed in ``notebooks/jupyter_config/labconfig/page_config.json`` (a Jupyter config directory:
``JUPYTER_CONFIG_PATH=notebooks/jupyter_config jupyter lab notebooks/`` uses it as it is). ``scripts/setup.sh`` runs
this file to merge it into the environment's own ``{sys.prefix}/etc/jupyter/labconfig/page_config.json``, which is
what ``jupyter labextension disable "@jupyterlab/apputils-extension:announcements"`` writes, so a plain
``jupyter lab notebooks/`` in that environment starts without the pop-up. Other keys of an existing file stay.

    python scripts/jupyter_offline.py [PREFIX]    # default: sys.prefix
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COMMITTED = Path(__file__).resolve().parents[1] / "notebooks" / "jupyter_config" / "labconfig" / "page_config.json"


def install(prefix: Path) -> Path:
    """Merge the committed page config into ``prefix``/etc/jupyter/labconfig/page_config.json (created if absent;
    the committed ``disabledExtensions`` entries are added to any already there). Returns the file written.

    Raises:
        ValueError: the existing file is not a JSON object.
    """
    target = Path(prefix) / "etc" / "jupyter" / "labconfig" / "page_config.json"
    current = json.loads(target.read_text()) if target.exists() else {}
    if not isinstance(current, dict):
        raise ValueError(f"{target} is not a JSON object")
    wanted = json.loads(COMMITTED.read_text())
    for key, entries in wanted.items():
        current[key] = {**current.get(key, {}), **entries}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(current, indent=2) + "\n")
    return target


if __name__ == "__main__":
    print(f"JupyterLab news and update check off: {install(Path(sys.argv[1] if len(sys.argv) > 1 else sys.prefix))}")

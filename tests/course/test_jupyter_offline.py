"""The course's JupyterLab starts without its news / update-check pop-up (it would reach for the internet): the
committed page config switches the announcements plugin off, JupyterLab itself reads it so, and setup's merge into an
environment keeps what was there."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "@jupyterlab/apputils-extension:announcements"


def _offline():
    spec = importlib.util.spec_from_file_location("jupyter_offline", ROOT / "scripts" / "jupyter_offline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_setup_merges_the_setting_and_keeps_the_rest(tmp_path):
    offline = _offline()
    target = tmp_path / "etc" / "jupyter" / "labconfig" / "page_config.json"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps({"disabledExtensions": {"other:plugin": True}, "theme": "dark"}))
    for _ in range(2):  # setup.sh may run again
        assert offline.install(tmp_path) == target
        assert json.loads(target.read_text()) == {"disabledExtensions": {"other:plugin": True, PLUGIN: True},
                                                  "theme": "dark"}
    fresh = offline.install(tmp_path / "new")
    assert json.loads(fresh.read_text()) == {"disabledExtensions": {PLUGIN: True}}
    target.write_text("[]")
    with pytest.raises(ValueError, match="JSON object"):
        offline.install(tmp_path)


def test_jupyterlab_reads_the_committed_config_as_the_plugin_off():
    jupyter = shutil.which("jupyter")
    if jupyter is None or importlib.util.find_spec("jupyterlab") is None:
        pytest.skip("JupyterLab is not installed")
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(ROOT / "notebooks" / "jupyter_config"), "NO_COLOR": "1"}
    p = subprocess.run([jupyter, "labextension", "list"], capture_output=True, text=True, env=env, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "Disabled extensions:" in out and PLUGIN in out.split("Disabled extensions:")[1]

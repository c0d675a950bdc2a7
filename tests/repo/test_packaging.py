"""The built wheel holds every file of the package's source tree: the bundled model, and the CPU attention
kernel's C++ source (``layers/cpu_attention.cpp``, compiled at first use; a wheel without it would run the slower
torch attention path on every non-editable install, silently). The list is derived from the tree, so a new .cpp
(or template, or data file) next to the code is covered the day it is added.

The slower test installs the wheel into a fresh virtualenv (its dependencies from this environment's
site-packages, appended by a .pth file after the new venv's own) and there: imports minengine from the wheel,
gets the kernel (loaded from its cache or built from the wheel's .cpp), generates with the bundled model (the
tokens equal this process's), and runs ``python -m minengine serve --help``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".so")  # bytecode and built libraries are outputs, not sources


def package_files() -> set[str]:
    """Every source file under minengine/, as the wheel names it (``minengine/layers/cpu_attention.cpp``)."""
    files = set()
    for dirpath, dirnames, filenames in os.walk(ROOT / "minengine"):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            if not name.endswith(SKIP_SUFFIXES):
                files.add((Path(dirpath) / name).relative_to(ROOT).as_posix())
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout (pip builds in the source tree: the copy keeps build/ and
    *.egg-info out of the checkout)."""
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(ROOT / "minengine", src / "minengine", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("minengine-*.whl")
    return path


def test_wheel_holds_every_file_of_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = package_files()
    assert "minengine/layers/cpu_attention.cpp" in expected
    assert any(n.startswith("minengine/assets/") for n in expected)
    missing = sorted(expected - names)
    assert not missing, f"the wheel lacks {len(missing)} file(s) the package has: {missing[:10]}"
    assert not [n for n in names if n.endswith(SKIP_SUFFIXES)]


INSTALLED_CHECK = """
import json, sys
import minengine
from minengine import LLM, SamplingParams
from minengine.config import BUNDLED_MODEL
from minengine.layers import cpu_attention

llm = LLM(model=BUNDLED_MODEL, max_model_len=128)
out = llm.generate(["ROMEO:"], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
kernel = cpu_attention.get_kernel(timeout_s=240)
print("RESULT " + json.dumps({"file": minengine.__file__, "prefix": sys.prefix, "model": BUNDLED_MODEL,
                              "kernel": kernel is not None, "status": cpu_attention.status().message,
                              "source": str(cpu_attention.SOURCE), "tokens": out[0].outputs[0].token_ids}))
"""


@pytest.mark.slow
def test_installed_wheel_builds_the_kernel_generates_and_serves_help(wheel, tmp_path, bundled_model):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    str(wheel)], check=True, timeout=300)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([str(python), "-c", where], text=True).strip())
    (site / "_shared_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after the venv's own
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MINENGINE_CPU_KERNEL")}
    proc = subprocess.run([str(python), "-c", INSTALLED_CHECK], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"exit code {proc.returncode}:\n{proc.stderr[-3000:]}"
    result = json.loads(lines[0][len("RESULT "):])
    assert Path(result["file"]).is_relative_to(venv) and Path(result["model"]).is_relative_to(venv)
    assert Path(result["source"]).is_relative_to(venv) and Path(result["source"]).exists()
    assert result["kernel"], result["status"]

    from minengine import LLM, SamplingParams

    here = LLM(model=bundled_model, max_model_len=128).generate(
        ["ROMEO:"], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert result["tokens"] == here[0].outputs[0].token_ids
    help_text = subprocess.run([str(python), "-m", "minengine", "serve", "--help"], capture_output=True, text=True,
                               env=env, cwd=tmp_path, timeout=120)
    assert help_text.returncode == 0 and "--tensor-parallel-size" in help_text.stdout
    assert (venv / "bin" / "minengine").exists()  # the console script

"""The quick start's interpreter: `make` takes python3.12 where it runs (jax 0.12), else python3."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def first_command(tmp_path, python312: str | None) -> str:
    """The first command `make -n demo` would run for a fresh venv, with PATH's python3.12 as given: a script
    (its body), or none that runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "python3.12"
    script.write_text(f"#!/bin/sh\n{python312 or 'exit 127'}\n")  # 127: as a pyenv shim of a version not enabled
    script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for inherited in ("PYTHON", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # under `make test PYTHON=...` (CI) these
        env.pop(inherited, None)  # carry the outer make's choice and its directory messages
    done = subprocess.run(["make", "--no-print-directory", "-n", "demo", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()[0]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
@pytest.mark.parametrize("runs", [True, False], ids=["python3.12-present", "python3.12-absent"])
def test_make_takes_python312_where_it_runs(tmp_path, runs):
    command = first_command(tmp_path, f'exec {sys.executable} "$@"' if runs else None)
    assert command == f"{'python3.12' if runs else 'python3'} -m venv {tmp_path / 'venv'}"

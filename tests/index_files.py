"""What a refresher left on disk, read the way a resumed run would (tests only)."""
import os
import re

from replug_jax.retrieval.index import read_meta


def saved_versions(workdir: str) -> list[int]:
    """Versions of the complete indexes saved in `workdir` (index_vN folders whose metadata reads), oldest first."""
    if not os.path.isdir(workdir):
        return []
    out = []
    for name in os.listdir(workdir):
        if re.fullmatch(r"index_v\d+", name):
            try:
                read_meta(os.path.join(workdir, name))
                out.append(int(name[len("index_v"):]))
            except (OSError, ValueError):
                pass
    return sorted(out)

"""One of two processes gathering megabytes through a host store served by the test (tests/test_host_store.py):
no JAX; `distributed` is given the store's client and this process's index, as `initialize` would give them."""
import json
import os
import sys

from replug_jax.parallel import distributed
from replug_jax.parallel.host_store import HostStoreClient
from replug_jax.lm.cache import CachedLM

port, index = int(sys.argv[1]), int(sys.argv[2])
distributed._store_client = HostStoreClient("127.0.0.1", port, os.environ["HOST_STORE_SECRET"])
distributed.process_index, distributed.process_count = (lambda: index), (lambda: 2)


def rows(i: int) -> list[dict]:
    """~3.4 MB of QA prediction rows (quotes, backslashes, accents and a character outside the BMP)."""
    return [{"id": f"q{i}-{n}", "question": 'who wrote "Ulysses" \\ é 𝄞?', "prediction": "James Joyce " * 20,
             "answers": ["James Joyce", "Joyce"], "em": n % 2} for n in range(10_000)]


gathered = distributed.WorkSplit(index, 2).gather(rows(index))  # the QA job's gather of its prediction rows
assert gathered == [rows(0), rows(1)], "gathered rows differ"
keys = [f"{n:064x}" for n in range(400_000)]  # a lockstep cache's miss lists: > 1 MiB of JSON from process 0
agreed = CachedLM._agreed_misses(keys, list(range(index, len(keys), 2 + index)))
assert agreed == sorted(set(range(0, len(keys), 2)) | set(range(1, len(keys), 3))), "agreed misses differ"
print("gathered", len(json.dumps(gathered)), "bytes")

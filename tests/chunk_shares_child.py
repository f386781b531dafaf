"""A child of `replug_jax.launch` in tests/test_multiprocess.py: chunks a corpus into WORKDIR/datastore.jsonl, each
process a share (`retrieval.chunk_shares`), documents without text left out, then builds it again (reused).

    python tests/chunk_shares_child.py CORPUS.jsonl WORKDIR CHUNK_TOKENS
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from replug_jax.parallel import distributed  # noqa: E402

assert distributed.initialize(), "not started by replug_jax.launch"

import replug_jax as rj  # noqa: E402
from replug_jax.jobs.prepare import build_datastore  # noqa: E402

corpus, workdir, chunk_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
tokenizer = rj.load_tokenizer("smollm2")
for call in ("built", "again"):  # the second call finds the first's file: reused, chunked by nobody
    store = build_datastore(corpus, tokenizer, chunk_tokens, workdir, drop_empty=True)
    print(f"{call}: passages={len(store)} fingerprint={store.fingerprint()}", flush=True)

"""The index refresher: swaps reflect the new parameters, exactly at request_step + swap_after,
readers never see a half-built index, failures keep the old index, saved indexes reload."""
import logging
import os
import threading
import time

import jax
import numpy as np
import pytest

import replug_jax as rj
from replug_jax.retrieval.datastore import Datastore
from replug_jax.retrieval.index import DenseIndex, IndexRefused
from replug_jax.retrieval.refresh import IndexRefresher
from tests.index_files import saved_versions

from tests import hf_tiny

WORDS = ["river", "stars", "bread", "violin", "snow", "desert", "oven", "mountain", "song", "mill"]
TEXTS = [f"{WORDS[i % 10]} and {WORDS[(3 * i + 1) % 10]} number {i}" for i in range(30)]
QUERIES = ["the river and the mill", "snow on the mountain", "a violin song", "bread in the oven"]
K = 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    hf_tiny.tiny_bert(str(path))
    enc = rj.load_encoder(str(path), batch_size=8)
    store = Datastore([f"c{i}" for i in range(len(TEXTS))], [""] * len(TEXTS), TEXTS, [f"d{i}" for i in range(len(TEXTS))])
    p0 = jax.device_get(enc.params)
    leaves, tree = jax.tree.flatten(p0)
    rng = np.random.default_rng(0)
    p1 = jax.tree.unflatten(tree, [a + 0.5 * rng.standard_normal(a.shape).astype(a.dtype) for a in leaves])
    queries = enc.embed(QUERIES, params=p0)  # fixed query vectors: only the index changes
    fresh = {name: DenseIndex.build(enc.embed(TEXTS, params=p)).search(queries, K) for name, p in (("p0", p0), ("p1", p1))}
    return enc, store, {"p0": p0, "p1": p1}, queries, fresh


def same(result, expected):
    return np.array_equal(result[1], expected[1]) and np.allclose(result[0], expected[0], atol=1e-6)


def test_sync_swap_reflects_new_params(setup):
    enc, store, params, queries, fresh = setup
    assert not same(fresh["p0"], fresh["p1"])  # the perturbation changes the rankings
    r = IndexRefresher(enc, store)  # swap_after=0: synchronous
    assert r.current is None and r.maybe_swap(0) is None
    r.request(params["p0"], step=0, version=0)
    assert r.pending["done"]  # the request itself built it
    info = r.maybe_swap(0)
    assert info["ok"] and info["version"] == 0 and info["step"] == 0 and r.version == 0
    assert same(r.search(queries, K), fresh["p0"])
    r.request(params["p1"], step=3, version=1)
    assert r.version == 0 and same(r.search(queries, K), fresh["p0"])  # not swapped before maybe_swap
    info = r.maybe_swap(3)
    assert info["ok"] and info["version"] == 1 and info["waited_seconds"] == info["build_seconds"] > 0
    assert same(r.search(queries, K), fresh["p1"])
    assert r.current.meta["encoder"] == enc.fingerprint(params["p1"]) != enc.fingerprint(params["p0"])
    assert r.current.meta["version"] == 1 and r.current.meta["request_step"] == 3
    with pytest.raises(ValueError, match="not newer"):
        r.request(params["p1"], step=4, version=1)


def test_async_swap_at_exact_step_while_training_continues(setup, monkeypatch):
    enc, store, params, queries, fresh = setup
    with IndexRefresher(enc, store, swap_after=3) as r:
        info = r.request(params["p0"], step=0, version=0, wait=True)  # the first index: built and served now
        assert info["ok"] and info["version"] == 0 and r.version == 0 and r.pending is None
        release, embed = threading.Event(), enc.embed

        def slow_embed(*args, **kwargs):
            release.wait(30)
            return embed(*args, **kwargs)

        monkeypatch.setattr(enc, "embed", slow_embed)
        r.request(params["p1"], step=2, version=1)
        with pytest.raises(RuntimeError, match="not swapped in yet"):
            r.request(params["p1"], step=3, version=2)
        seen, infos = {}, {}
        for step in range(2, 9):
            infos[step] = r.maybe_swap(step)
            seen[step] = r.version
            if step in (2, 3, 4):  # training steps run while the build is still going
                assert r.pending == {"version": 1, "request_step": 2, "swap_step": 5, "done": False}
                assert same(r.search(queries, K), fresh["p0"])
                _ = np.linalg.norm(np.ones((64, 64)) @ np.ones((64, 64)))  # a "train step"
            if step == 4:
                threading.Timer(0.3, release.set).start()  # the build finishes only after step 5 began
        assert seen == {2: 0, 3: 0, 4: 0, 5: 1, 6: 1, 7: 1, 8: 1}
        assert [s for s, i in infos.items() if i] == [5]
        info = infos[5]
        assert info["ok"] and info["step"] == 5 and info["request_step"] == 2 and info["waited_seconds"] >= 0.2
        assert same(r.search(queries, K), fresh["p1"])

        # a build that is done before it is due is not swapped early, and costs no wait
        monkeypatch.setattr(enc, "embed", embed)
        r.request(params["p0"], step=9, version=2)
        deadline = time.time() + 60
        while not r.pending["done"] and time.time() < deadline:
            time.sleep(0.01)
        assert r.maybe_swap(11) is None and r.version == 1
        info = r.maybe_swap(12)
        assert info["version"] == 2 and info["waited_seconds"] < 0.1 and same(r.search(queries, K), fresh["p0"])


def test_readers_never_see_a_half_built_index(setup):
    enc, store, params, queries, fresh = setup
    r = IndexRefresher(enc, store, swap_after=1)
    r.request(params["p0"], step=0, version=0)
    assert r.maybe_swap(0)["version"] == 0  # due at step 1, but nothing is serving yet: installed at once
    results, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            version, index = r.snapshot()
            results.append((version, index.search(queries, K), r.search(queries, K)))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        def wait_for(n):
            deadline = time.time() + 60
            while len(results) < n and time.time() < deadline:
                time.sleep(0.005)

        wait_for(5)
        r.request(params["p1"], step=1, version=1)
        assert r.maybe_swap(1) is None
        assert r.maybe_swap(2)["ok"]
        wait_for(len(results) + 5)
    finally:
        stop.set()
        thread.join()
    labels = []
    for version, from_snapshot, from_search in results:
        expected = fresh["p0"] if version == 0 else fresh["p1"]
        assert same(from_snapshot, expected)  # the version and the index were read together
        assert same(from_search, fresh["p0"]) or same(from_search, fresh["p1"])
        labels.append(version)
    assert labels[0] == 0 and labels[-1] == 1 and labels == sorted(labels)  # old, then new, never back


def test_failed_build_keeps_old_index_and_is_reported(setup, monkeypatch, caplog, tmp_path):
    enc, store, params, queries, fresh = setup
    r = IndexRefresher(enc, store, swap_after=1, workdir=str(tmp_path))
    r.request(params["p0"], step=0, version=0)
    r.maybe_swap(0)
    embed = enc.embed

    def broken(*args, **kwargs):
        raise RuntimeError("encoder exploded")

    monkeypatch.setattr(enc, "embed", broken)
    r.request(params["p1"], step=1, version=1)
    with caplog.at_level(logging.WARNING, logger="replug_jax.retrieval.refresh"):
        info = r.maybe_swap(2)
    assert info["ok"] is False and info["version"] == 1 and "encoder exploded" in info["error"]
    assert "refresh v1 failed" in caplog.text
    assert r.version == 0 and same(r.search(queries, K), fresh["p0"]) and r.pending is None
    assert saved_versions(str(tmp_path)) == [0]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no half-written index left behind
    monkeypatch.setattr(enc, "embed", embed)
    r.request(params["p1"], step=3, version=2)  # the next refresh works again
    assert r.maybe_swap(4)["ok"] and r.version == 2 and same(r.search(queries, K), fresh["p1"])
    r.close()


def test_saved_indexes_reload_and_are_pruned(setup, tmp_path):
    enc, store, params, queries, fresh = setup
    r = IndexRefresher(enc, store, workdir=str(tmp_path), keep=2)
    for version, p in enumerate(["p0", "p1", "p0"]):
        r.request(params[p], step=version, version=version)
        assert r.maybe_swap(version)["reused"] is False
    assert saved_versions(str(tmp_path)) == [1, 2]
    assert sorted(os.listdir(tmp_path)) == ["index_v1", "index_v2"]  # the embeddings files are gone

    resumed = IndexRefresher(enc, store, workdir=str(tmp_path), swap_after=2)
    resumed.load_version(1, expected={"encoder": enc.fingerprint(params["p1"])})
    assert resumed.version == 1 and same(resumed.search(queries, K), fresh["p1"])
    resumed.request(params["p0"], step=5, version=2)  # the same build was saved before the "restart"
    info = resumed.maybe_swap(7)
    assert info["ok"] and info["reused"] and same(resumed.search(queries, K), fresh["p0"])
    with pytest.raises(FileNotFoundError):
        resumed.load_version(0)
    with pytest.raises(IndexRefused, match="encoder"):
        resumed.load_version(2, expected={"encoder": enc.fingerprint(params["p1"])})
    with pytest.raises(IndexRefused, match="factory"):
        IndexRefresher(enc, store, workdir=str(tmp_path), factory="HNSW32").load_version(2)


def test_adopt_an_index_and_a_failing_first_build(setup, monkeypatch, tmp_path):
    enc, store, params, queries, fresh = setup
    built = DenseIndex.build(enc.embed(TEXTS, params=params["p0"]),
                             meta={"encoder": enc.fingerprint(params["p0"]), "datastore": store.fingerprint()})
    r = IndexRefresher(enc, store, workdir=str(tmp_path), swap_after=1)
    r.adopt(built, version=0)
    assert r.version == 0 and same(r.search(queries, K), fresh["p0"]) and "version" not in built.meta
    assert saved_versions(str(tmp_path)) == [0]  # so that a resumed run can load_version(0)
    resumed = IndexRefresher(enc, store, workdir=str(tmp_path))
    assert same((resumed.load_version(0), resumed.search(queries, K))[1], fresh["p0"])
    other = Datastore([f"o{i}" for i in range(len(TEXTS))], [""] * len(TEXTS), TEXTS[::-1],
                      ["s"] * len(TEXTS))
    with pytest.raises(IndexRefused, match="datastore"):
        IndexRefresher(enc, other).adopt(built)

    def broken(*args, **kwargs):
        raise RuntimeError("no encoder today")

    monkeypatch.setattr(enc, "embed", broken)
    with pytest.raises(RuntimeError, match="no encoder today"):  # nothing to fall back on
        IndexRefresher(enc, store).request(params["p0"], step=0, version=0, wait=True)


def test_close_does_not_hang_on_a_build_blocked_outside_the_embedding(setup, monkeypatch, caplog):
    """A build stuck where cancellation cannot reach it (several processes: a barrier whose peer left) is left to
    the process, with a warning: close() returns within its timeout."""
    enc, store, params, _, _ = setup
    release, entered, embed = threading.Event(), threading.Event(), enc.embed

    def stuck(*args, **kwargs):  # past the cancellation check, blocked as at a barrier
        entered.set()
        release.wait(120)
        return embed(*args, **kwargs)

    r = IndexRefresher(enc, store, swap_after=2)
    r.request(params["p0"], step=0, version=0, wait=True)
    monkeypatch.setattr(enc, "embed", stuck)
    r.request(params["p1"], step=1, version=1)
    build = r._pending["thread"]
    assert entered.wait(60), "the build never reached the embedding"  # close only once it is blocked there
    closer = threading.Thread(target=r.close, kwargs={"timeout": 1})
    with caplog.at_level(logging.WARNING):
        closer.start()
        closer.join(30)
    release.set()
    build.join(60)  # no build thread left running JAX work when the interpreter exits
    assert not closer.is_alive(), "close() hung on the blocked build"
    assert "did not stop within 1s" in caplog.text and r.pending is None and not build.is_alive()

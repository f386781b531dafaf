"""On-device exact search (`DeviceIndex`): rows split over 8 fake CPU devices, equal to FAISS Flat."""
import jax
import numpy as np
import pytest

from replug_jax.parallel import sharding
from replug_jax.retrieval.device_index import DeviceIndex
from replug_jax.retrieval.index import DenseIndex


def data(n=1003, d=32, q=37, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(np.float32), rng.normal(size=(q, d)).astype(np.float32)


@pytest.mark.parametrize("metric", ["cosine", "ip"])
def test_equals_faiss_flat_on_eight_devices(metric):
    embeddings, queries = data()
    flat = DenseIndex.build(embeddings, metric=metric)
    device = DeviceIndex.from_embeddings(embeddings, metric=metric)
    assert device.mesh.devices.size == 8 and device.matrix.shape == (1008, 32)  # padded to a multiple of 8
    for k in (1, 10, 130):  # 130 > 1008 / 8 rows per device: the merge must take several from one device
        want_scores, want_rows = flat.search(queries, k)
        scores, rows = device.search(queries, k)
        assert np.array_equal(rows, want_rows)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    assert (device.search(queries, 1003)[1] < 1003).all()  # every row, never a pad row


def test_exclusions_one_device_and_small_corpora_agree_with_faiss():
    embeddings, queries = data(n=40, q=5)
    flat = DenseIndex.build(embeddings)
    exclude = [set(range(10)), None, {int(flat.search(queries[2:3], 1)[1][0, 0])}, set(range(0, 40, 2)), set()]
    want = flat.search(queries, 4, exclude=exclude)
    for mesh in (None, sharding.data_mesh(jax.devices()[:1])):
        got = DeviceIndex.from_embeddings(embeddings, meta={"datastore": "x"}, mesh=mesh).search(queries, 4, exclude)
        assert np.array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    tiny = DeviceIndex.from_embeddings(embeddings[:5])  # fewer rows than devices: pad rows on most of them
    assert np.array_equal(tiny.search(queries, 5)[1], DenseIndex.build(embeddings[:5]).search(queries, 5)[1])
    callable_rule = lambda q, rows: rows < 30  # noqa: E731 (only rows 30..39 allowed: the search goes deeper)
    got = DeviceIndex.from_embeddings(embeddings).search(queries, 4, exclude=callable_rule)
    assert np.array_equal(got[1], flat.search(queries, 4, exclude=callable_rule)[1])


def test_bfloat16_matrix_keeps_nearly_the_same_neighbours():
    embeddings, queries = data(n=4000, d=64, q=50)
    exact = DenseIndex.build(embeddings).search(queries, 20)
    scores, rows = DeviceIndex.from_embeddings(embeddings, dtype="bfloat16").search(queries, 20)
    recall = np.mean([len(set(a) & set(b)) / 20 for a, b in zip(rows.tolist(), exact[1].tolist())])
    assert recall >= 0.9 and np.abs(scores - exact[0]).max() < 2e-2
    assert scores.dtype == np.float32


def test_compiles_once_per_depth_and_refuses_bad_input():
    embeddings, queries = data(n=100)
    index = DeviceIndex.from_embeddings(embeddings)
    for q in (3, 5, 8, 1):  # query counts padded to one bucket (a power of two, at least the 8 devices)
        index.search(queries[:q], 4)
    assert len(index._fns) == 1 and index._fns[4]._cache_size() == 1
    index.search(queries[:9], 4)
    assert index._fns[4]._cache_size() == 2  # the 16-query bucket
    with pytest.raises(ValueError, match="larger than the corpus"):
        index.search(queries, 101)
    with pytest.raises(ValueError, match="index dimension"):
        index.search(queries[:, :5], 2)
    with pytest.raises(ValueError, match="empty embeddings"):
        DeviceIndex.from_embeddings(np.zeros((0, 4), np.float32))
    with pytest.raises(ValueError, match="dtype"):
        DeviceIndex.from_embeddings(embeddings, dtype="int8")
    assert index.search(queries[:0], 3)[1].shape == (0, 3)

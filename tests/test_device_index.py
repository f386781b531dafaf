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


@pytest.mark.parametrize("queries", [1, 10])
def test_a_tie_group_goes_to_its_lowest_rows_as_in_the_flat_index(queries):
    """30 identical rows scattered among 4,000 (3 or 4 on each of the 8 devices), k 4: the four lowest of the group,
    for a query alone and among others, as the flat index answers (scores bit for bit); with two excluded, the next
    four. The device's float32 top_k keeps arbitrary members of a tie group; the float64 ranking of a closed window
    does not."""
    rng = np.random.default_rng(3)
    emb = rng.normal(size=(4000, 32)).astype(np.float32)
    query = rng.normal(size=32).astype(np.float32)
    twins = np.sort(rng.choice(4000, 30, replace=False))
    emb[twins] = query * 5 + rng.normal(size=32).astype(np.float32) * 0.1
    batch = np.concatenate([query[None], rng.normal(size=(queries - 1, 32)).astype(np.float32)])
    flat, device = DenseIndex.build(emb, metric="cosine"), DeviceIndex.from_embeddings(emb, metric="cosine")
    scores, rows = device.search(batch, 4)
    assert rows[0].tolist() == twins[:4].tolist()
    want = flat.search(batch, 4)
    np.testing.assert_array_equal(rows, want[1])
    np.testing.assert_array_equal(scores, want[0])
    exclude = [twins[:2].tolist()] + [None] * (queries - 1)
    assert device.search(batch, 4, exclude=exclude)[1][0].tolist() == twins[2:6].tolist()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_query_ranks_the_same_alone_as_among_others(dtype):
    """Rows closer together than float32 resolves (200 near-copies of 3 q, inner product) and duplicated rows (the
    last 40 repeat the first): a query's rows and scores are the same bit for bit alone, in a batch of 37 and in the
    reverse order, duplicates to the lower row; in float32 they equal the flat index's."""
    embeddings, queries = data(n=1003, d=64, q=37, seed=5)
    embeddings[500:700] = queries[0] * 3 + np.random.default_rng(6).normal(size=(200, 64)).astype(np.float32) * 1e-6
    embeddings = np.concatenate([embeddings, embeddings[:40]])
    device = DeviceIndex.from_embeddings(embeddings, metric="ip", dtype=dtype)
    together = device.search(queries, 40)
    backwards = device.search(queries[::-1], 40)
    alone = [device.search(queries[i : i + 1], 40) for i in (0, 1, 2, 36)]
    np.testing.assert_array_equal(np.concatenate([r for _, r in alone]), together[1][[0, 1, 2, 36]])
    np.testing.assert_array_equal(np.concatenate([s for s, _ in alone]), together[0][[0, 1, 2, 36]])
    np.testing.assert_array_equal(backwards[1][::-1], together[1])
    np.testing.assert_array_equal(backwards[0][::-1], together[0])
    twins = [(list(r).index(a), list(r).index(a + 1003)) for r in together[1] for a in r if a < 40 and a + 1003 in r]
    assert twins and all(first < second for first, second in twins)  # equal scores: the lower row first
    if dtype == "float32":
        want = DenseIndex.build(embeddings, metric="ip").search(queries, 40)
        np.testing.assert_array_equal(together[1], want[1])
        np.testing.assert_array_equal(together[0], want[0])


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
    (top,) = index._fns.values()  # one candidate depth (k 4 and the window past it)
    assert top._cache_size() == 1
    index.search(queries[:9], 4)
    assert top._cache_size() == 2  # the 16-query bucket
    with pytest.raises(ValueError, match="larger than the corpus"):
        index.search(queries, 101)
    with pytest.raises(ValueError, match="index dimension"):
        index.search(queries[:, :5], 2)
    with pytest.raises(ValueError, match="empty embeddings"):
        DeviceIndex.from_embeddings(np.zeros((0, 4), np.float32))
    with pytest.raises(ValueError, match="dtype"):
        DeviceIndex.from_embeddings(embeddings, dtype="int8")
    assert index.search(queries[:0], 3)[1].shape == (0, 3)

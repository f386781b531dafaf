"""Bucket workdirs: a stand-in for gs:// (fsspec's in-memory file system behind etils.epath, the layer gcsfs
plugs into) holds the job's files after a run; a second run on a fresh machine pulls them and reuses them; an
unreachable bucket is refused at start in one line, with no local folder named "gs:"."""
import json
import os
import shutil
import subprocess
import sys

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from ml_collections import config_dict

from replug_jax import main as entry
from replug_jax.jobs import bucket_workdirs
from replug_jax.base.atomic_files import atomic_directory, atomic_open, temporary_path

from tests import hf_tiny
from tests.lsr_tiny_run import documents

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FakeBucket(MemoryFileSystem):
    """gs:// served from memory (what gcsfs would be on a TPU VM)."""

    protocol = ("gs", "gcs")

    failing = None  # a path part whose uploads fail (a network error mid-push), where a test sets one

    def __init__(self, *args, finalize_on_close=None, **kwargs):
        super().__init__(*args, **kwargs)

    def _open(self, path, mode="rb", **kwargs):
        if self.failing and "w" in mode and self.failing in path:
            raise OSError(f"upload of {path} failed")
        return super()._open(path, mode, **kwargs)


@pytest.fixture
def bucket(monkeypatch):
    import importlib

    backend = importlib.import_module("etils.epath.backend")

    for name in ("gs", "gcs"):
        fsspec.register_implementation(name, FakeBucket, clobber=True)
    backend.fsspec_backend._get_filesystem.cache_clear()
    MemoryFileSystem.store.clear()
    yield
    MemoryFileSystem.store.clear()  # (the stand-in stays registered in this process: nothing else opens gs://)


def test_staging_pulls_pushes_changes_only(bucket, tmp_path):
    from etils import epath

    remote = epath.Path("gs://bucket/run")
    (remote / "sub").mkdir(parents=True, exist_ok=True)
    (remote / "sub" / "old.txt").write_text("from an earlier VM")
    staging = bucket_workdirs.Staging("gs://bucket/run", local=str(tmp_path / "stage"))
    staging.check()
    assert staging.pull() == 1 and open(tmp_path / "stage" / "sub" / "old.txt").read() == "from an earlier VM"
    (tmp_path / "stage" / "new.json").write_text("{}")
    assert staging.push() == 1 and (remote / "new.json").read_text() == "{}"
    assert staging.push() == 0  # nothing changed: nothing sent
    (tmp_path / "stage" / "new.json").write_text('{"a": 1}')
    assert staging.push() == 1 and (remote / "new.json").read_text() == '{"a": 1}'


def test_an_lm_eval_job_in_a_bucket_workdir_leaves_its_files_there_and_resumes(bucket, tmp_path, monkeypatch):
    from etils import epath

    models = tmp_path / "models"
    hf_tiny.tiny_bert(str(models / "enc"))
    hf_tiny.tiny_gpt2(str(models / "lm"), positions=256)
    for name, docs in (("corpus", documents("c", 6, seed=1)), ("heldout", documents("h", 2, seed=3))):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n" for d in docs)
    config = config_dict.ConfigDict(dict(
        job="lm_eval", corpus=str(tmp_path / "corpus.jsonl"), eval_data=str(tmp_path / "heldout.jsonl"),
        encoder=str(models / "enc"), lm=str(models / "lm"), k=2, k_sweep=(1, 2), temperature=1.0,
        bm25_temperature=1.0, doc_tokens=24, query_tokens=16, context_tokens=16, stride_tokens=24, max_eval_docs=2,
        max_windows_per_doc=2, methods=("replug",), metric="cosine", index_factory="Flat", embedding_dtype="float32",
        lm_batch_size=8, lm_max_length=0, encoder_batch_size=8, seed=0, dtype="float32"))
    first = None
    for vm in ("first", "second"):  # the second VM starts with an empty staging directory
        monkeypatch.setenv(bucket_workdirs.ENV_STAGING, str(tmp_path / vm))
        staging = bucket_workdirs.staged("gs://bucket/runs/demo")
        if vm == "second":  # pulled before any work: the first VM's index, embeddings and results
            assert {"index_dense", "datastore.jsonl", "results.json"} <= set(os.listdir(staging.local))
        try:
            results = entry.run_job(config, staging.local)
        finally:
            bucket_workdirs.finish(staging)
        remote = epath.Path("gs://bucket/runs/demo")
        saved = json.loads((remote / "results.json").read_text())
        assert saved["perplexity"] == pytest.approx(results["perplexity"])
        first = first if vm == "second" else saved
        assert saved["perplexity"] == pytest.approx(first["perplexity"])
        assert (remote / "index_dense").is_dir() and (remote / "datastore.jsonl").exists()
    assert not os.path.exists(os.path.join(ROOT, "gs:"))


def test_an_unreachable_bucket_is_refused_at_start_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "replug_jax.main", "--config", "experiments/configs/demo.py",
                           "--workdir", "gs://no-such-bucket/run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", bucket_workdirs.ENV_STAGING: str(tmp_path / "s")})
    assert done.returncode == 2 and "error: --workdir gs://no-such-bucket/run: cannot write there" in done.stderr
    assert "Traceback" not in done.stderr and not os.path.exists(os.path.join(ROOT, "gs:"))


def test_sync_pushes_the_active_staging_mid_job(bucket, tmp_path, monkeypatch):
    """What the LSR loop calls after each checkpoint: the bucket has the checkpoint before the job ends."""
    from etils import epath

    monkeypatch.setenv(bucket_workdirs.ENV_STAGING, str(tmp_path))
    staging = bucket_workdirs.staged("gs://bucket/lsr")
    os.makedirs(os.path.join(staging.local, "lsr", "checkpoints", "20"))
    with open(os.path.join(staging.local, "lsr", "checkpoints", "20", "state"), "w") as f:
        f.write("step 20")
    bucket_workdirs.sync()
    assert epath.Path("gs://bucket/lsr/lsr/checkpoints/20/state").read_text() == "step 20"
    bucket_workdirs.finish(staging)
    bucket_workdirs.sync()  # no active staging: nothing to do


def test_pull_mirrors_the_bucket_by_checksum(bucket, tmp_path):
    """A same-size stale file is replaced, local files the bucket lacks (a stale staged checkpoint, an SQLite
    journal) are deleted, and an unchanged file is not copied again."""
    from etils import epath

    remote = epath.Path("gs://bucket/run")
    (remote / "index").mkdir(parents=True, exist_ok=True)
    (remote / "index" / "meta.json").write_text('{"v": 2}')
    (remote / "cache.sqlite-wal").write_text("a WAL without its database's state")
    stage = tmp_path / "stage"
    (stage / "index").mkdir(parents=True)
    (stage / "index" / "meta.json").write_text('{"v": 1}')  # same size, other bytes
    (stage / "checkpoints" / "40").mkdir(parents=True)
    (stage / "checkpoints" / "40" / "state").write_text("a stale checkpoint of an earlier run")
    (stage / "cache.sqlite-journal").write_text("stale")
    staging = bucket_workdirs.Staging("gs://bucket/run", local=str(stage))
    assert staging.pull() == 1
    assert (stage / "index" / "meta.json").read_text() == '{"v": 2}'
    assert sorted(os.listdir(stage)) == ["index"]  # no checkpoint, journal or WAL
    assert staging.pull() == 0
    assert staging.push() == 0 and (remote / "cache.sqlite-wal").exists() is False  # the bucket = the local copy


def test_push_mirrors_the_local_copy_and_skips_unfinished_files(bucket, tmp_path):
    """The bucket loses what the local copy lacks; temporary files and SQLite side files stay local; an SQLite
    database written through a WAL (still open) arrives as a consistent snapshot with every committed row."""
    import sqlite3

    from etils import epath

    remote = epath.Path("gs://bucket/run")
    (remote / "checkpoints" / "20").mkdir(parents=True, exist_ok=True)
    (remote / "checkpoints" / "20" / "state").write_text("an old checkpoint")
    stage = tmp_path / "stage"
    staging = bucket_workdirs.Staging("gs://bucket/run", local=str(stage))
    staging.pull()
    os.remove(stage / "checkpoints" / "20" / "state")  # pruned locally: the bucket must lose it too
    (stage / "results.json").write_text("{}")
    with open(temporary_path(str(stage / "retriever.safetensors"), "save"), "w") as f:  # weights.save_params's
        f.write("half")
    (stage / ".index_v2.old-k3j_9x0a.replug_jax-tmp").mkdir()  # atomic_directory's replaced folder, being removed
    (stage / ".index_v2.old-k3j_9x0a.replug_jax-tmp" / "index.faiss").write_text("replaced")
    (stage / "7.orbax-checkpoint-tmp").mkdir()
    (stage / "7.orbax-checkpoint-tmp" / "state").write_text("being saved")
    db = sqlite3.connect(str(stage / "lm_cache.sqlite"))
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (k TEXT)")
    db.executemany("INSERT INTO t VALUES (?)", [(str(i),) for i in range(100)])
    db.commit()
    assert os.path.exists(stage / "lm_cache.sqlite-wal")
    with atomic_open(str(stage / "results.json")) as f, atomic_directory(str(stage / "index_v3")) as building:
        f.write("{")  # mid-write, and an index mid-build: pushed while their temporaries exist
        with open(os.path.join(building, "index.faiss"), "w") as g:
            g.write("being built")
        assert staging.push() == 2
    assert sorted(fsspec.filesystem("gs").find("gs://bucket/run")) == ["gs://bucket/run/lm_cache.sqlite",
                                                                       "gs://bucket/run/results.json"]
    copy = tmp_path / "copy.sqlite"
    (remote / "lm_cache.sqlite").copy(epath.Path(copy))
    assert sqlite3.connect(str(copy)).execute("SELECT COUNT(*) FROM t").fetchone() == (100,)
    assert staging.push() == 2  # results.json and index_v3/index.faiss, in place
    assert staging.push() == 0  # nothing changed
    db.execute("INSERT INTO t VALUES ('more')")
    db.commit()
    assert staging.push() == 1
    db.close()


def test_an_upload_that_fails_deletes_nothing(bucket, tmp_path, monkeypatch):
    """The bucket holds checkpoints 20 and 40; locally 20 is pruned and 60 saved; 60's upload fails: the bucket still
    holds 20 and 40 (uploads come before deletions), and the next push makes it equal the local copy."""
    from etils import epath

    for step in (20, 40):
        (epath.Path("gs://bucket/run/checkpoints") / str(step)).mkdir(parents=True, exist_ok=True)
        (epath.Path("gs://bucket/run/checkpoints") / str(step) / "state").write_text(f"step {step}")
    stage = tmp_path / "stage"
    staging = bucket_workdirs.Staging("gs://bucket/run", local=str(stage))
    staging.pull()
    shutil.rmtree(stage / "checkpoints" / "20")
    (stage / "checkpoints" / "60").mkdir()
    (stage / "checkpoints" / "60" / "state").write_text("step 60")
    held = lambda: sorted(p.split("checkpoints/")[1] for p in fsspec.filesystem("gs").find("gs://bucket/run"))
    monkeypatch.setattr(FakeBucket, "failing", "checkpoints/60/")
    with pytest.raises(OSError, match="upload of .*checkpoints/60/state failed"):
        staging.push()
    assert held() == ["20/state", "40/state"]
    monkeypatch.setattr(FakeBucket, "failing", None)
    assert staging.push() == 1 and held() == ["40/state", "60/state"]


def test_user_files_named_like_temporaries_are_mirrored(bucket, tmp_path):
    """Only the project's own temporary names (its mark, base.atomic_files.TEMPORARY_MARK) stay local: a user's
    notes.part, draft.tmp, .hidden.tmp and v1.old-copy/ are pulled and pushed like any file, and a bucket copy of one
    is not deleted; so is a user's file named like each temporary name the project wrote before it had a mark (a
    dated backup `index_dense.old-20251127/` was never pulled, then deleted from the bucket by the next push)."""
    from etils import epath

    remote = epath.Path("gs://bucket/run")
    remote.mkdir(parents=True, exist_ok=True)
    (remote / "notes.part").write_text("the user's")
    stage = tmp_path / "stage"
    staging = bucket_workdirs.Staging("gs://bucket/run", local=str(stage))
    assert staging.pull() == 1 and (stage / "notes.part").read_text() == "the user's"
    (stage / "draft.tmp").write_text("mine")
    (stage / ".hidden.tmp").write_text("mine too")
    (stage / "v1.old-copy").mkdir()
    (stage / "v1.old-copy" / "a.txt").write_text("kept")
    assert staging.push() == 3
    assert sorted(p.split("run/")[1] for p in fsspec.filesystem("gs").find("gs://bucket/run")) == [
        ".hidden.tmp", "draft.tmp", "notes.part", "v1.old-copy/a.txt"]
    former = [".results.json.k3j_9x0a.tmp", "tmpk3j_9x0a.tmp", ".index.tmp-k3j_9x0a/index.faiss",
              "index_dense.old-20251127/index.faiss", "retriever.safetensors.tmp", ".cache.sqlite.snapshot.tmp",
              ".notes.txt.pull.tmp"]  # mkstemp's, atomic_directory's, save_params's, the snapshot's, the pull's
    for name in former:
        (remote / name).parent.mkdir(parents=True, exist_ok=True)
        (remote / name).write_text("the user's")
    assert staging.pull() == len(former) and all((stage / name).read_text() == "the user's" for name in former)
    assert staging.push() == 0 and all((remote / name).exists() for name in former)
    assert bucket_workdirs.ignored(os.path.basename(temporary_path("run/index", "pull")))
    assert bucket_workdirs.ignored("checkpoints/7.orbax-checkpoint-tmp-1732/state")  # orbax's own unfinished step


def test_a_bucket_retriever_workdir_is_checked_and_staged(bucket, tmp_path, monkeypatch):
    """--config.retriever_workdir=gs://...: check_job_inputs accepts it when the bucket holds a trained retriever
    (and refuses one that does not), and the job reads the retriever files from a local copy (not the rest)."""
    from etils import epath

    from replug_jax.jobs import input_checks, prepare
    from replug_jax.jobs.config_files import sibling_config

    monkeypatch.setenv(bucket_workdirs.ENV_STAGING, str(tmp_path / "staging"))
    remote = epath.Path("gs://bucket/lsr")
    (remote / "checkpoints" / "2").mkdir(parents=True, exist_ok=True)
    (remote / "checkpoints" / "2" / "state").write_text("not needed to evaluate")
    (remote / "retriever.safetensors").write_bytes(b"trained parameters")
    (remote / "train_questions.json").write_text("[]")
    qa = sibling_config(os.path.join(ROOT, "experiments", "configs", "sciq.py"), "sciq.py")
    qa.lm, qa.methods, qa.retriever_workdir = "smollm2", ("replug", "replug_lsr"), "gs://bucket/lsr"
    input_checks.check_job_inputs(qa)
    folder = prepare.retriever_folder("gs://bucket/lsr")
    assert sorted(os.listdir(folder)) == ["retriever.safetensors", "train_questions.json"]
    assert open(os.path.join(folder, "retriever.safetensors"), "rb").read() == b"trained parameters"
    qa.retriever_workdir = "gs://bucket/empty"
    with pytest.raises(input_checks.InputError, match="gs://bucket/empty/retriever.safetensors does not exist"):
        input_checks.check_job_inputs(qa)


def test_a_finished_run_computed_by_other_code_is_reused_with_a_line_naming_that_code(tmp_path, capsys):
    """Issue 69, item 6: `results_file.finished_run` (the experiments scripts' reuse) says which code computed a run
    it reuses when that is not this checkout: another version, another commit, or uncommitted changes; a run of this
    very code is reused without a word, and one of another config is still refused."""
    import json

    import ml_collections

    import replug_jax
    from replug_jax.jobs import results_file

    config = ml_collections.ConfigDict({"job": "qa", "k": 4})
    here = {"replug_jax": replug_jax.__version__, **results_file.git_commit()}

    def reuse(software: dict) -> str:
        results = {"complete": True, "config": results_file.config_record(config), "software": software}
        (tmp_path / "results.json").write_text(json.dumps(results))
        assert results_file.finished_run(str(tmp_path), config)["software"] == software
        return capsys.readouterr().err

    assert reuse(dict(here, git_dirty=False)) == ""
    assert "computed by replug_jax 0.0.1" in reuse(dict(here, replug_jax="0.0.1"))
    assert "at commit 0123456789ab" in reuse(dict(here, git_commit="0123456789abcdef", git_dirty=False))
    assert "with uncommitted changes" in reuse(dict(here, git_dirty=True))
    assert "reusing a finished run" in reuse({})  # a run that recorded no software: said, not taken for this code
    with pytest.raises(SystemExit, match="another config: k 4"):
        results_file.finished_run(str(tmp_path), ml_collections.ConfigDict({"job": "qa", "k": 5}))


def test_a_rerun_with_another_config_or_changed_files_says_so_and_keeps_the_earlier_results(tmp_path):
    """Issue 69, item 2: before a run writes over a workdir's results, a run of another config or of input files
    whose content changed is said in a warning naming what differs, and the earlier results.md and predictions.jsonl
    are kept under history/ beside its results.json copy; the same run again (a resume) is said nothing."""
    import ml_collections

    from replug_jax.jobs import results_file

    corpus, workdir = tmp_path / "corpus.jsonl", tmp_path / "w"
    corpus.write_text('{"text": "Velmora is a town."}\n')
    workdir.mkdir()
    config = ml_collections.ConfigDict({"job": "qa", "k": 4, "corpus": str(corpus), "lm_cache": "workdir"})
    results_file.save({"config": results_file.config_record(config), "run_id": "r1", "complete": True}, str(workdir))
    (workdir / "results.md").write_text("the earlier table")
    (workdir / "predictions.jsonl").write_text('{"id": "q1"}\n')
    assert results_file.keep_earlier_run(str(workdir), config) is None
    assert results_file.keep_earlier_run(str(workdir), ml_collections.ConfigDict(dict(config, lm_cache=""))) is None
    k8 = ml_collections.ConfigDict(dict(config, k=8))
    said = results_file.keep_earlier_run(str(workdir), k8)
    assert said.startswith(f"{workdir} held the results of another run (k 4 -> 8)")
    assert (workdir / "history" / "results-r1.md").read_text() == "the earlier table"
    assert (workdir / "history" / "predictions-r1.jsonl").read_text() == '{"id": "q1"}\n'
    assert "history/results-r1.json" in said and "history/predictions-r1.jsonl" in said
    results_file.save({"config": results_file.config_record(k8), "run_id": "r2"}, str(workdir))
    assert json.load(open(workdir / "results.json"))["earlier_run"] == said  # the new run's results.json says it too
    assert results_file.keep_earlier_run(str(workdir), k8) is None  # that run resumed: nothing to say or record
    results_file.save({"config": results_file.config_record(k8), "run_id": "r3"}, str(workdir))
    assert "earlier_run" not in json.load(open(workdir / "results.json"))
    corpus.write_text('{"text": "Velmora is a city."}\n')
    said = results_file.keep_earlier_run(str(workdir), config)
    assert "k 8 -> 4; the content of --config.corpus)" in said

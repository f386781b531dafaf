"""What can the retriever learn from the LM on QA pairs? LSR on fixed candidate pools, measured on held-out questions.

    python experiments/qa_lsr_pools.py --workdir runs/qa_lsr/pools --lm_cache runs/qa_lsr/smollm2/lm_cache.sqlite

Each question's pool is its top `--depth` passages under the initial retriever; the LM scores every pool once
(ℓ_k = log p(y | d_k ∘ x), zero-shot as LSR training scores them, through the shared cache). Training then runs
the project's jitted LSR step (query side only: the documents' index vectors are fixed) for `--epochs` over
the training pools without another LM call, so learning rates, γ and the KL direction can be compared in
minutes. After each epoch, on training and held-out pools: top-1 accuracy (the retriever's best passage is the
LM's best), Spearman(score, ℓ), and the SEQUENCE-mixture answer NLL, −log Σ_i λ_i p(y | d_i ∘ x), over the top
`--k` by the new scores at τ = 1 and τ = γ (λ = softmax(s / τ)), against the same at the initial parameters and the
oracle (the k passages of highest ℓ). It mixes whole-answer likelihoods (as LSR's Q does), so its numbers are not
the QA job's answer NLL, which mixes per token: keys and tables say "seq NLL". Held-out questions are sciq.py's
evaluated ones (rows after the demos); training ones come from `train_offset` on, as in experiments/configs/qa_lsr.py.
Writes WORKDIR/pools.json and a table.

`--train_questions 150,300,0` trains once per training-set size (0: all), for a learning curve: does what the
retriever learns on more questions carry over further? `--eval_lms qwen2.5-coder-0.5b` also scores the held-out
pools with another LM and reports the same metrics under its ℓ (`heldout@LM`): the reader's own room, and
whether a retriever trained on one LM's scores helps another (the paper's transfer claim). `--supervisor LM`
trains on another LM's ℓ over the same passages (still cut with SmolLM2's tokenizer). `--save_retriever DIR` keeps
one run's last-epoch query encoder where the QA job reads an LSR-trained retriever (DIR/answer and DIR/question with
both targets), so that its exact match is measured by generation: `python experiments/qa_lsr.py --lm
qwen2.5-coder-0.5b --trained DIR`, or any job's `--config.methods=replug_lsr --config.retriever_workdir=DIR`.

`--lsr_targets answer,question` (issue 37, item 3) trains once per target: "answer" is the paper's teacher (ℓ as
above), "question" the LM's posterior over the passages, ℓ_k = log p(x | d_k) (ART), which needs no answers:
`--unlabelled olmes:sciq:rc_0shot,olmes:arc_easy:rc_0shot --max_unlabelled 2000` adds questions without answers to
its training pools (any whose text is a SciQ validation question's is dropped: disjoint from the evaluated rows). Held-out metrics always judge by the answer ℓ; `posterior_top1` says how
often the retriever's first passage is the LM's posterior's first (held-out pools scored with both ℓ).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiments/: lsr_headroom

from lsr_headroom import spearman  # noqa: E402

from replug_jax.jobs import prepare  # noqa: E402
from replug_jax.jobs.config_files import sibling_config  # noqa: E402
from replug_jax.jobs.input_checks import check_job_inputs  # noqa: E402
from replug_jax.data.question_sets import load_mc, load_qa  # noqa: E402
from replug_jax.data import olmes  # noqa: E402
from replug_jax.data.records import QAExample  # noqa: E402
from replug_jax.jobs import results_file, trained_retriever  # noqa: E402
from replug_jax.method.passages import QA_DOC_TEMPLATE  # noqa: E402
from replug_jax.parallel import sharding  # noqa: E402
from replug_jax.train import step as train_step_lib  # noqa: E402
from replug_jax.train.batch import FrozenDocumentVectors, make_batch, supervise, supervise_targets  # noqa: E402
from replug_jax.train.queries import (first_training_row, qa_training_examples, question_key,  # noqa: E402
                                   trained_questions_record)
from replug_jax.train.lm_cache import LMScoreCache  # noqa: E402


def logsumexp(x, axis=-1):
    return np.logaddexp.reduce(x, axis=axis)


def pool_metrics(scores: np.ndarray, ell: np.ndarray, k: int, taus, ell_question=None) -> dict:
    """scores, ell: [N, depth]. REPLUG's sequence-mixture answer NLL (−log Σ λ p(y | d)) over the top k by `scores`,
    top-1 accuracy and Spearman; with `ell_question` [N, depth] (log p(x | d)) also `posterior_top1`."""
    top = np.argsort(-scores, axis=1)[:, :k]  # [N, k]
    s_top, ell_top = np.take_along_axis(scores, top, 1), np.take_along_axis(ell, top, 1)
    out = {"top1_accuracy": float(np.mean(scores.argmax(1) == ell.argmax(1))),
           "spearman": float(np.mean([spearman(s, e) for s, e in zip(scores, ell)]))}
    if ell_question is not None:
        out["posterior_top1"] = float(np.mean(scores.argmax(1) == ell_question.argmax(1)))
    for tau in taus:
        log_lam = s_top / tau - logsumexp(s_top / tau)[:, None]
        out[f"seq_nll_tau{tau:g}"] = float(-logsumexp(log_lam + ell_top).mean())
    return out


def oracle_nll(ell: np.ndarray, k: int) -> float:
    best = -np.sort(-ell, axis=1)[:, :k]
    return float(-(logsumexp(best) - np.log(k)).mean())


def unlabelled_questions(sources: str, limit: int, seed: int = 0, exclude=()) -> list[QAExample]:
    """Questions without answers from a comma list of "mmlu:SPLIT" (MMLU's question texts), "olmes:TASK:FORM"
    (an OLMES request file's questions: science questions for sciq, arc_easy, arc_challenge, openbookqa),
    "nq_open", "trivia_qa" or a .jsonl file; those whose normalised text is among `exclude`'s (the evaluated and
    labelled questions) dropped, the rest shuffled with `seed` and the first `limit` (0: all) kept."""
    questions = []
    for source in filter(None, sources.split(",")):
        if source.startswith("mmlu:"):
            questions += [QAExample(q.id, q.question, ()) for q in load_mc("mmlu", source.split(":", 1)[1])]
        elif task_form := olmes.parse_source(source):
            questions += [QAExample(q.id, q.question, ()) for q in olmes.load_olmes(*task_form)[0]]
        else:
            questions += [QAExample(q.id, q.question, ()) for q in load_qa(source, answers_required=False)]
    excluded = {question_key(q) for q in exclude}
    questions = [q for q in questions if question_key(q.question) not in excluded]
    order = np.random.default_rng(seed).permutation(len(questions))
    return [questions[i] for i in order[:limit or None]]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--lm_cache", default="", help="the shared LM-score cache (SQLite) of earlier runs")
    p.add_argument("--cache_dir", default="", help="datastore and index shared with earlier runs")
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--train_questions", default="0", help="comma list of training-set sizes (0: all from train_offset on)")
    p.add_argument("--eval_lms", default="", help="comma list of other LMs that score the held-out pools too")
    p.add_argument("--supervisor", default="", help="the LM whose ℓ trains (and scores `heldout`); default: config.lm, "
                   "which also cuts the passages. Other LMs' scores are cached beside --lm_cache")
    p.add_argument("--heldout", type=int, default=200)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--learning_rates", default="1e-5,1e-4,1e-3")
    p.add_argument("--gamma", type=float, default=0.1)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--direction", default="q_pr")
    p.add_argument("--lsr_targets", default="answer", help="comma list: answer (ℓ = log p(y | d, x)), question "
                   "(ℓ = log p(x | d), no answers needed); one training run per target")
    p.add_argument("--unlabelled", default="", help="comma list of question sources the question target also trains "
                   "on: mmlu:SPLIT, olmes:TASK:FORM, nq_open, trivia_qa or a .jsonl (any SciQ validation question "
                   "dropped)")
    p.add_argument("--max_unlabelled", type=int, default=0, help="at most this many unlabelled questions (0: all)")
    p.add_argument("--save_retriever", default="", help="a folder for the last epoch's query encoder (one learning "
                   "rate and training-set size; with both targets, one subfolder each): retriever.safetensors and "
                   "train_questions.json, which the QA job's replug_lsr method reads (--config.retriever_workdir, or "
                   "qa_lsr.py --trained)")
    args = p.parse_args(argv)
    targets = args.lsr_targets.split(",")
    if not set(targets) <= {"answer", "question"}:
        raise ValueError(f"--lsr_targets {args.lsr_targets!r}: use answer, question or both")
    if args.unlabelled and "question" not in targets:
        raise ValueError("--unlabelled questions have no answers: only --lsr_targets question trains on them")
    runs = [(target, size, lr) for target in targets for size in map(int, args.train_questions.split(","))
            for lr in map(float, args.learning_rates.split(","))]  # (target, training questions, learning rate)
    if args.save_retriever and len(runs) != len(targets):
        raise ValueError(f"--save_retriever keeps one run per target, but --learning_rates x --train_questions asks "
                         f"{len(runs) // len(targets)}")

    config = sibling_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "x"), "qa_lsr.py")
    config.lm_cache = args.lm_cache
    check_job_inputs(config)  # before any model loads (every setting's range: base/settings.py)
    os.makedirs(args.workdir, exist_ok=True)
    shared = args.cache_dir or os.path.join(args.workdir, "shared")
    encoder = prepare.load_job_encoder(config, None)
    lm = prepare.cached_lm(prepare.load_job_lm(config, None), config)
    tokenizer = prepare.lm_tokenizer(lm, config)
    store = prepare.build_corpus(config.corpus, tokenizer, config.doc_tokens, shared, split=config.split)
    index = prepare.job_index(encoder, store, shared, metric=config.metric, factory=config.index_factory,
                                embedding_dtype=config.embedding_dtype)
    questions = load_qa(config.train_data, config.train_split)
    first_evaluated = config.shots  # sciq.py: the first `shots` rows are the demos, the evaluated ones follow
    first_trained = first_training_row(config.train_data, config.train_offset)  # sciq: 300
    sets = {"train": qa_training_examples(questions[first_trained:], seed=config.seed),
            "heldout": qa_training_examples(questions[first_evaluated:first_evaluated + args.heldout], seed=0)}
    if args.unlabelled:
        known = [q.question for q in questions]  # every SciQ validation question: evaluated, demos, labelled
        sets["unlabelled"] = qa_training_examples(unlabelled_questions(args.unlabelled, args.max_unlabelled,
                                                                       exclude=known),
                                                  seed=config.seed, target="question")
        print(f"unlabelled: {len(sets['unlabelled'])} questions from {args.unlabelled}", flush=True)
    scorers = {}  # LM name -> its LMScoreCache; the passages stay the ones cut with config.lm's tokenizer

    def scorer(name: str) -> LMScoreCache:
        if name not in scorers:
            other = name != config.lm
            where = os.path.dirname(args.lm_cache) or args.workdir
            file = "lm_cache_" + re.sub(r"[^\w.-]", "_", name) + ".sqlite"  # a hub id or URL as one file name
            scorers[name] = LMScoreCache(os.path.join(where, file if other else "lm_cache.sqlite"),
                                         prepare.load_job_lm(with_lm(config, name), None) if other else lm)
        return scorers[name]

    vectors = FrozenDocumentVectors(index)
    pools = {}
    for name, examples in sets.items():
        scores, rows = index.search(encoder.embed([e.query for e in examples], progress=True), args.depth)
        pools[name] = {"examples": examples, "rows": rows, "initial": scores}
        needed = {"train": targets, "unlabelled": ["question"],  # held-out: judged by the answer ℓ
                  "heldout": ["answer"] + (["question"] if "question" in targets else [])}[name]
        ells = supervise_targets(scorer(args.supervisor or config.lm), store, examples, rows, needed,
                                 lm_score=config.lm_score, doc_template=QA_DOC_TEMPLATE, progress=True)  # one pass
        pools[name].update({"ell" if target == "answer" else "ell_question": ell for target, ell in ells.items()})
        print(f"{name}: {len(examples)} questions, ℓ scored", flush=True)
    for other in filter(None, args.eval_lms.split(",")):  # the same passages and questions, another LM's ℓ
        held = pools["heldout"]
        ell = supervise(scorer(other), store, held["examples"], held["rows"], lm_score=config.lm_score,
                        doc_template=QA_DOC_TEMPLATE, progress=True)
        pools[f"heldout@{other}"] = {**held, "ell": ell}
        print(f"heldout@{other}: ℓ scored", flush=True)
    taus = (1.0, args.gamma)

    def evaluate(params, train=None, target="answer") -> dict:
        """Metrics on `pools_to_judge`; `train`: the pool a run trained on, `target` its teacher."""
        out = {}
        for name, pool in pools_to_judge(pools, train, target).items():
            q = encoder.embed([e.query for e in pool["examples"]], params=params)  # [N, D]
            s = np.einsum("nkd,nd->nk", vectors(pool["rows"]), q)
            out[name] = pool_metrics(s, pool["ell"], args.k, taus, pool.get("ell_question"))
        return out

    judged = pools_to_judge(pools)
    report = {"settings": vars(args), "initial": evaluate(None),
              "oracle_nll": {n: oracle_nll(pool["ell"], args.k) for n, pool in judged.items()},
              "oracle_top1_nll": {n: oracle_nll(pool["ell"], 1) for n, pool in judged.items()},
              "ell_range": {n: float(np.mean(pool["ell"].max(1) - pool["ell"].min(1))) for n, pool in judged.items()},
              "runs": {}}
    print(json.dumps(report["initial"]), flush=True)
    for target, size, lr in runs:
        if 0 < size < args.batch_size:
            raise ValueError(f"--train_questions {size} is fewer than one batch of {args.batch_size}")
        train = training_pool(pools, target, size)
        name = (f"{lr:g}" if size == 0 else f"{lr:g}, {len(train['examples'])} questions") + \
            ("" if targets == ["answer"] else f", {target} target")
        report["runs"][name], params = train_on_pools(train, lr, args, config, encoder, store, vectors,
                                                      functools.partial(evaluate, target=target))
        with open(os.path.join(args.workdir, "pools.json"), "w") as f:
            json.dump(report, f, indent=1)
        if args.save_retriever:
            lsr = {"gamma": args.gamma, "beta": args.beta, "direction": args.direction, "learning_rate": lr,
                   "lsr_target": target,
                   "epochs": args.epochs, "batch_size": args.batch_size, "k": args.depth, "train_documents": False,
                   "supervisor": args.supervisor or config.lm}
            folder = args.save_retriever if len(targets) == 1 else os.path.join(args.save_retriever, target)
            save_retriever(folder, params, config, train["examples"], lsr)
    print_table(report, taus)
    return report


def training_pool(pools: dict, target: str, size: int) -> dict:
    """The pool one run trains on: the first `size` labelled questions (0: all) with the `target`'s ℓ as "ell";
    the question target adds the unlabelled pool, if any."""
    keys = ("examples", "rows", "initial")
    train = {**{key: pools["train"][key][:size or None] for key in keys},
             "ell": pools["train"]["ell" if target == "answer" else "ell_question"][:size or None]}
    if target == "question" and "unlabelled" in pools:
        extra = pools["unlabelled"]
        train = {"examples": train["examples"] + extra["examples"],
                 **{key: np.concatenate([train[key], extra[src]]) for key, src in
                    (("rows", "rows"), ("initial", "initial"), ("ell", "ell_question"))}}
    return train


def pools_to_judge(pools: dict, train=None, target: str = "answer") -> dict:
    """name -> pool for the metrics after an epoch: every pool with answers ("ell" is the answer ℓ) and, with
    `train`, the pool the run trained on. The answer target's pool (a learning curve's subset) is "train". The
    question target's holds log p(x | d) as its ℓ, so its "seq NLL" is the question's NLL (tens of nats), not the
    answer's: it is reported as "trained on, ℓ = log p(x | d)", and "train" stays the labelled questions judged
    by their answers."""
    judged = {name: pool for name, pool in pools.items() if "ell" in pool}
    if train is not None:
        judged["train" if target == "answer" else "trained on, ℓ = log p(x | d)"] = train
    return judged


def with_lm(config, name: str):
    """A copy of `config` whose LM is `name`."""
    other = config.copy_and_resolve_references()
    other.lm = name
    return other


def save_retriever(folder: str, params, config, examples, lsr: dict) -> None:
    """The trained query encoder as the LSR job leaves it (query side: the QA job searches the original index with
    it), the training questions, which the QA job refuses to evaluate, and results.json with the settings `lsr`
    (qa_lsr.py --trained reads γ there)."""
    trained_retriever.save(folder, params, encoder=config.encoder, train_documents=False,
                           questions=trained_questions_record(config.train_data, examples),
                           trained_by="experiments/qa_lsr_pools.py " + json.dumps(lsr))
    results_file.save({"task": "lsr_qa_pools", "train_data": config.train_data, "training_questions": len(examples),
                       "encoder": config.encoder, "lsr": lsr}, folder)
    print(f"saved the trained retriever in {folder}", flush=True)


def train_on_pools(train: dict, lr: float, args, config, encoder, store, vectors, evaluate) -> tuple[list[dict], dict]:
    """`args.epochs` epochs of the jitted LSR step over the fixed training pools; `evaluate` after each.
    Returns (the per-epoch metrics, the last epoch's parameters)."""
    steps_per_epoch = len(train["examples"]) // args.batch_size
    optimizer = train_step_lib.make_optimizer(lr, steps_per_epoch * args.epochs, 0.1, 1.0)
    step = train_step_lib.make_train_step(encoder.config, optimizer, sharding.global_mesh(),
                                          gamma=args.gamma, beta=args.beta, direction=args.direction)
    state = train_step_lib.init_train_state(encoder.params, optimizer, sharding.global_mesh())
    curve = []
    for epoch in range(1, args.epochs + 1):
        order = np.random.default_rng(epoch).permutation(len(train["examples"]))
        losses = []
        for b in range(steps_per_epoch):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            batch = make_batch(encoder, store, [train["examples"][i] for i in idx], train["rows"][idx],
                               train["ell"][idx], query_max_tokens=config.query_max_tokens,
                               doc_max_tokens=config.doc_max_tokens, doc_vectors=vectors)
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))
        curve.append({"epoch": epoch, "loss": float(np.mean(losses)), **evaluate(state["params"], train)})
        print(f"lr {lr:g}, {len(train['examples'])} questions, epoch {epoch}: " + json.dumps(curve[-1]), flush=True)
    return curve, state["params"]


def print_table(report, taus):
    """Per run its last epoch and the epoch best on held-out seq NLL at τ = γ (a choice made on held-out data)."""
    cols = ["top1_accuracy", "spearman"] + [f"seq_nll_tau{t:g}" for t in taus] + \
        (["posterior_top1"] if "posterior_top1" in report["initial"]["heldout"] else [])
    row = lambda m: " | ".join(f"{m[c]:.3f}" if c in m else "" for c in cols)  # noqa: E731
    print("| run | set | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 2))
    for name, m in report["initial"].items():
        print(f"| initial | {name} | {row(m)} |")
    for lr, curve in report["runs"].items():
        best = min(curve, key=lambda r: r["heldout"][f"seq_nll_tau{taus[1]:g}"])
        for label, epoch in (("last", curve[-1]), ("best on held-out", best)):
            for name in (n for n in epoch if n not in ("epoch", "loss")):
                print(f"| lr {lr}, epoch {epoch['epoch']} ({label}) | {name} | {row(epoch[name])} |")
    print("oracle seq NLL (best k of the pool, uniform):", report["oracle_nll"], "best passage alone:",
          report["oracle_top1_nll"], "mean ℓ range:", report["ell_range"])


if __name__ == "__main__":
    from replug_jax.jobs.command_line import script_entry

    script_entry(main)  # a mistake in a setting: one line, exit 2

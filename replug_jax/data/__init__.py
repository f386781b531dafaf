"""Corpora and evaluation data that work offline: the Wikipedia articles (`wiki`), the question sets (MMLU, NQ-open,
TriviaQA, JSONL and DPR files: `question_sets`), SciQ (`sciq`), OLMES requests (`olmes`), a job's questions and demos
(`evaluation_sets`), the example records (`records`) and SQuAD answer normalisation (`answers`).

Layer: imports `retrieval` (the datastore's documents) and `base`; never `lm`, `evaluate`, `train` or `jobs`.
"""
from replug_jax.data.wiki import (
                                  clean_wikitext,
                                  load_wiki_articles,
                                  split_articles,
                                  split_related,
                                  wiki_articles_path,
                                  write_jsonl,
)

__all__ = ["clean_wikitext", "load_wiki_articles", "split_articles", "split_related", "wiki_articles_path", "write_jsonl"]

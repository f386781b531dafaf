"""Corpora and evaluation data that work offline: the Wikipedia articles (`wiki`), MMLU, NQ-open, TriviaQA, JSONL
and DPR files (`downstream`), SciQ, OLMES requests, a job's questions and demos, SQuAD answer normalisation.

Layer: imports `retrieval` (the datastore's documents), `models` (tokenizers) and below; never `lm`, `evaluate`, `train`.
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

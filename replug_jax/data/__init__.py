"""Corpora and evaluation data that work offline (see wiki.py for the demo Wikipedia corpus)."""
from replug_jax.data.wiki import (clean_wikitext, load_wiki_articles, split_articles, split_related, wiki_articles_path,
                                  write_jsonl)

__all__ = ["clean_wikitext", "load_wiki_articles", "split_articles", "split_related", "wiki_articles_path", "write_jsonl"]

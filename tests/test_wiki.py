"""The offline Wikipedia demo corpus: parsing, markup stripping, the split by article."""
import importlib.util
import random

import pytest

from replug_jax.data import wiki
from replug_jax.retrieval.datastore import Document, read_jsonl

MARKUP = ("{{", "}}", "[[", "]]", "<ref", "</ref", "{|", "|}", "&nbsp;", "&amp;", "'''", "<!--", "==", "thumb|")


@pytest.fixture(scope="module")
def articles():
    return wiki.load_wiki_articles()


def test_articles_load_offline_without_markup(articles):
    assert len(articles) > 90
    assert all(isinstance(a, Document) for a in articles)
    assert len({a.id for a in articles}) == len(articles)
    assert sum(len(a.text) for a in articles) > 2_000_000
    assert min(len(a.text) for a in articles) >= 500
    titles = {a.title for a in articles}
    assert {"Anarchism", "Albert Einstein", "Aristotle"} <= titles
    assert not any("(disambiguation)" in t for t in titles)
    for a in articles:
        for pattern in MARKUP:
            assert pattern not in a.text, (a.title, pattern, a.text[max(0, a.text.find(pattern) - 80):][:200])
        assert "\n\n\n" not in a.text and a.text == a.text.strip()
    anarchism = next(a for a in articles if a.title == "Anarchism")
    assert anarchism.text.startswith("Anarchism is a political philosophy")


def test_clean_wikitext_handles_the_usual_markup():
    text = """{{Infobox thing|name={{nowrap|X}}|image=[[File:a.jpg|thumb|A [[cat]]]]}}
'''Foo''' ({{IPA-en|fuː|}}) is a [[bar (baz)|bar]] of [[Qux]]es, {{convert|5|km|mi}} long.<ref name="a">{{cite web|url=http://x.org|title=T}}</ref> See [http://example.org the site].<ref name="a"/>
[[File:Foo.jpg|thumb|left|Caption with [[link]] and {{lang|fr|texte}}]]
== History ==
<!-- hidden -->It spoke {{lang|fr|un peu}}&nbsp;French &ndash; and ''more''.<br />
{| class="wikitable"
|-
| cell {{flag|FR}} || [[cell]]
|}
* A list item with [[wikt:word|a word]].
== See also ==
* [[Something else]]
=== Sub ===
Nothing here.
== Later ==
Back to prose.
[[Category:Things]]
[[de:Foo]]"""
    out = wiki.clean_wikitext(text)
    assert out.split("\n\n") == [
        "Foo is a bar of Quxes, 5 km long. See the site.",
        "It spoke un peu French – and more.",
        "A list item with a word.",
        "Back to prose.",
    ]


def test_split_is_by_article_disjoint_and_deterministic(articles):
    parts = wiki.split_articles(articles, eval_fraction=0.1, train_fraction=0.15, seed=0)
    ids = {name: [a.id for a in docs] for name, docs in parts.items()}
    assert len(ids["eval"]) == round(0.1 * len(articles)) and len(ids["train"]) == round(0.15 * len(articles))
    assert sorted(sum(ids.values(), [])) == sorted(a.id for a in articles)
    assert not set(ids["datastore"]) & (set(ids["eval"]) | set(ids["train"]))
    assert not set(ids["eval"]) & set(ids["train"])
    # no held-out paragraph is in the datastore
    store = {p for a in parts["datastore"] for p in a.text.split("\n\n") if len(p) > 200}
    held = [p for a in parts["eval"] + parts["train"] for p in a.text.split("\n\n") if len(p) > 200]
    assert held and not any(p in store for p in held)
    # deterministic, independent of input order; another seed gives another split
    shuffled = list(articles)
    random.Random(1).shuffle(shuffled)
    again = wiki.split_articles(shuffled, eval_fraction=0.1, train_fraction=0.15, seed=0)
    assert {n: {a.id for a in d} for n, d in again.items()} == {n: set(v) for n, v in ids.items()}
    assert [a.id for a in wiki.split_articles(articles, 0.1, 0.15, seed=0)["eval"]] == ids["eval"]
    assert {a.id for a in wiki.split_articles(articles, 0.1, 0.15, seed=1)["eval"]} != set(ids["eval"])
    with pytest.raises(ValueError):
        wiki.split_articles(articles, 0.6, 0.4)


def test_related_split_puts_each_held_out_articles_opening_in_the_datastore(articles):
    by_article = wiki.split_articles(articles, eval_fraction=0.1, train_fraction=0.15, seed=0)
    parts = wiki.split_related(articles, eval_fraction=0.1, train_fraction=0.15, held_out_fraction=0.4, seed=0)
    original = {a.id: a for a in articles}
    assert parts["datastore"][: len(by_article["datastore"])] == by_article["datastore"]
    heads = {d.id: d for d in parts["datastore"][len(by_article["datastore"]):]}
    for name in ("eval", "train"):
        assert [d.id for d in parts[name]] == [f"{a.id}#tail" for a in by_article[name]]
        for tail in parts[name]:
            article = original[tail.id.removesuffix("#tail")]
            head = heads[f"{article.id}#head"]
            assert head.text + "\n\n" + tail.text == article.text and head.title == tail.title == article.title
            assert 0.2 < len(tail.text) / len(article.text) < 0.6  # about 40%, cut at a paragraph boundary
    # the scored text itself is never in the datastore; the same article's opening is
    store = {p for d in parts["datastore"] for p in d.text.split("\n\n") if len(p) > 200}
    held = [p for d in parts["eval"] + parts["train"] for p in d.text.split("\n\n") if len(p) > 200]
    assert held and not any(p in store for p in held)
    assert len(heads) == len(parts["eval"]) + len(parts["train"])
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match="held_out_fraction"):
            wiki.split_related(articles, held_out_fraction=bad)


def test_write_jsonl_round_trips(tmp_path, articles):
    path = str(tmp_path / "sub" / "docs.jsonl")
    assert wiki.write_jsonl(articles[:3], path) == 3
    assert list(read_jsonl(path)) == articles[:3]


def test_missing_gensim_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gensim==4.4.0"):
        wiki.wiki_articles_path()

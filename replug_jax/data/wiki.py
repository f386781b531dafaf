"""The offline demo corpus: ~100 full English Wikipedia articles shipped inside gensim's test data.

    articles = load_wiki_articles()                     # list[Document(id, title, text)]
    parts = split_articles(articles, eval_fraction=0.1, train_fraction=0.1, seed=0)
    write_jsonl(parts["datastore"], "data/datastore.jsonl")

gensim==4.4.0 (install it with `pip install --no-deps gensim==4.4.0`; only its data file
is used, gensim itself is never imported, since it needs smart_open) carries a shortened
2016 enwiki dump. The dump is parsed with `xml.etree.ElementTree.iterparse`, and the
wikitext is turned into plain prose here: comments, <ref>s, templates (nested), tables,
files, categories and interlanguage links are removed; links and external links keep
their visible text; a few templates that carry prose ({{convert}}, {{lang}}, dashes) are
rendered; reference-like sections ("References", "See also", ...) are dropped. The text
of an article is its paragraphs joined by blank lines.
"""
from __future__ import annotations

import bz2
import hashlib
import html
import importlib.util
import itertools
import json
import os
import re
import xml.etree.ElementTree as ET
from typing import Iterable, Sequence

from replug_jax.base.atomic_files import atomic_open
from replug_jax.base.errors import InputError, MissingInput
from replug_jax.retrieval.datastore import Document

WIKI_DUMP = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
_INSTALL = "pip install --no-deps gensim==4.4.0"

_DROP_SECTIONS = {"see also", "references", "external links", "further reading", "notes", "bibliography",
                  "sources", "footnotes", "citations", "notes and references", "works cited", "gallery",
                  "references and notes", "notes and citations", "primary sources", "secondary sources"}
_DROP_LINK_NS = {"file", "image", "media", "category"}
_INTERWIKI = {"wikt", "wiktionary", "s", "w", "wikiquote", "q", "wp", "wikipedia", "template", "b", "n", "v", "doi"}
_DROP_TAGS = "math|gallery|timeline|imagemap|score|syntaxhighlight|source|hiero|chem|ce|graph|mapframe"
_SIMPLE = {"ndash": "–", "mdash": "—", "snd": " – ", "spaced ndash": " – ", "spaced en dash": " – ", "'": "'",
           "`": "'", "!": "|", "=": "=", "middot": "·", "okina": "ʻ", "-": ""}
_FIRST_ARG = {"nowrap", "nobr", "small", "smaller", "big", "em", "strong", "abbr", "mvar", "var", "math", "sic",
              "not a typo", "keypress", "vr", "bigger", "code", "wikt-lang", "lang-rtl", "linktext", "visible anchor"}

_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.S)
_REF_SELF = re.compile(r"<ref\b[^<>]*/>", re.I)
_REF = re.compile(r"<ref\b[^<>]*>.*?(?:</ref\s*>|$)", re.I | re.S)
_REFERENCES = re.compile(r"<references\b[^<>]*/>|<references\b[^<>]*>.*?</references\s*>", re.I | re.S)
_BLOCK_TAG = re.compile(rf"<({_DROP_TAGS})\b[^<>]*>.*?</\1\s*>", re.I | re.S)
_TEMPLATE = re.compile(r"\{\{(?:(?!\{\{|\}\})[\s\S])*\}\}")  # innermost {{...}}
_TABLE = re.compile(r"\{\|(?:(?!\{\|)[\s\S])*?\|\}")  # innermost {| ... |}
_LINK = re.compile(r"\[\[((?:(?!\[\[|\]\])[\s\S])*)\]\]")  # innermost [[...]]
_EXT_LINK = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]*\s*([^\]]*)\]")
_BR = re.compile(r"<br\s*/?>", re.I)
_TAG = re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*(?:\s[^<>]*)?/?>")
_QUOTES = re.compile(r"'{2,}")
_MAGIC = re.compile(r"__[A-Z]+__")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")


def wiki_articles_path() -> str:
    """Path of the enwiki dump inside the installed gensim package (found without importing gensim)."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise MissingInput(f"the demo Wikipedia corpus ships with gensim's test data: {_INSTALL}")
    path = os.path.join(list(spec.submodule_search_locations)[0], WIKI_DUMP)
    if not os.path.exists(path):
        raise MissingInput(f"{path} is missing (gensim without its test data?): {_INSTALL}")
    return path


def _template(match: re.Match) -> str:
    """Render the few templates that carry prose; every other template is removed."""
    parts = [p.strip() for p in match.group(0)[2:-2].split("|")]
    name, args = parts[0].lower().replace("_", " "), [p for p in parts[1:] if "=" not in p]
    if name in _SIMPLE:
        return _SIMPLE[name]
    if name in ("convert", "cvt") and args:
        return " ".join(args[:2]) if len(args) > 1 and not args[1].replace(".", "").isdigit() else " ".join(args[:1] + args[2:3])
    if name in ("lang", "transl") and len(args) >= 2:
        return args[-1]
    if name.startswith("lang-") and args:
        return args[0]
    if name in _FIRST_ARG and args:
        return args[0]
    if name == "frac" and args:
        return "/".join(args)
    if name in ("circa", "c.") and args:
        return "c. " + args[0]
    return ""


def _link(match: re.Match) -> str:
    target, _, label = match.group(1).partition("|")
    colon = target.startswith(":")
    prefix, sep, rest = target.lstrip(":").partition(":")
    prefix = prefix.strip().lower()
    if sep and not colon and prefix in _DROP_LINK_NS:
        return ""  # images (with their captions) and categories
    if sep and not label and not colon and re.fullmatch(r"[a-z]{2,3}(-[a-z]+)*", prefix) and prefix not in _INTERWIKI:
        return ""  # interlanguage link
    if label:
        return label.rsplit("|", 1)[-1] if prefix in _DROP_LINK_NS else label
    return rest if sep and prefix in _INTERWIKI else target.lstrip(":")


def _innermost(pattern: re.Pattern, repl, text: str) -> str:
    """Apply `pattern` (which matches innermost constructs) until nothing nested is left."""
    while True:
        new = pattern.sub(repl, text)
        if new == text:
            return new
        text = new


def _clean_line(line: str) -> str:
    line = re.sub(r"^[*#:;]+\s*", "", line)
    line = re.sub(r"\(\s*[,;:]?\s*\)", "", line)  # parentheses emptied by removed templates
    line = re.sub(r"[ \t\u00a0\u2009\u200b]+", " ", line)
    line = re.sub(r"\(\s*[,;]?\s*", "(", line)
    line = re.sub(r"\s+([,.;:!?)])", r"\1", line)
    line = re.sub(r"([,;])(?:\s*[,;])+", r"\1", line)
    return line.strip()


def clean_wikitext(text: str) -> str:
    """Plain prose from wikitext: paragraphs separated by blank lines, no markup left."""
    text = _COMMENT.sub("", text)
    text = _REF_SELF.sub("", text)
    text = _REF.sub("", text)
    text = _REFERENCES.sub("", text)
    text = _BLOCK_TAG.sub("", text)
    text = _innermost(_LINK, _link, text)  # before templates: a link's "|" is not a template's
    text = _innermost(_TEMPLATE, _template, text)
    text = _innermost(_TABLE, "", text)
    text = _EXT_LINK.sub(r"\1", text)
    text = _BR.sub(" ", text)
    text = _TAG.sub("", text)
    text = _QUOTES.sub("", text)
    text = _MAGIC.sub("", text)
    text = html.unescape(text)
    paragraphs, drop_level = [], 0
    for line in text.splitlines():
        heading = _HEADING.match(line.strip())
        if heading:
            level = len(heading.group(1))
            if drop_level and level > drop_level:
                continue
            drop_level = level if heading.group(2).strip().lower() in _DROP_SECTIONS else 0
            continue
        if drop_level or line.lstrip().startswith(("|", "!", "{|", "|}", "----")):
            continue
        line = _clean_line(line)
        if re.search(r"[^\W\d_]", line):  # keep lines with at least one letter
            paragraphs.append(line)
    return "\n\n".join(paragraphs)


def _iter_pages(path: str):
    """(page id, title, wikitext) of each main-namespace, non-redirect page in a bz2 XML dump."""
    with bz2.open(path, "rb") as f:
        for _, elem in ET.iterparse(f, events=("end",)):
            if elem.tag.rsplit("}", 1)[-1] != "page":
                continue
            if elem.findtext("{*}ns") == "0" and elem.find("{*}redirect") is None:
                yield elem.findtext("{*}id"), elem.findtext("{*}title"), elem.findtext("{*}revision/{*}text") or ""
            elem.clear()


def load_wiki_articles(path: str | None = None, min_chars: int = 500,
                       skip_disambiguation: bool = True) -> list[Document]:
    """The dump's articles as Documents (id = Wikipedia page id, title, plain-text body), in dump order.

    Redirects, other namespaces, disambiguation pages (if `skip_disambiguation`) and
    articles whose cleaned text is shorter than `min_chars` characters are left out.
    """
    articles = []
    for page_id, title, wikitext in _iter_pages(path or wiki_articles_path()):
        if skip_disambiguation and ("(disambiguation)" in title or re.search(r"\{\{\s*disambig", wikitext, re.I)):
            continue
        text = clean_wikitext(wikitext)
        if len(text) >= min_chars:
            articles.append(Document(str(page_id), title, text))
    return articles


def split_articles(articles: Sequence[Document], eval_fraction: float = 0.1, train_fraction: float = 0.1,
                   seed: int = 0) -> dict[str, list[Document]]:
    """Split BY ARTICLE into {"datastore", "eval", "train"}, deterministically.

    REPLUG is scored on held-out text while retrieving from the datastore: if passages of
    an evaluation (or LSR training) article were also in the datastore, the retriever
    would find the very passage being scored (or its neighbours from the same article),
    and the LM would copy it, so the measured gain would be leakage, not retrieval. Whole
    articles therefore go to exactly one part. An article's part depends only on `seed` and
    its id (it is ranked by sha256(seed:id)), not on the order of the input; each part
    keeps the input order. round(fraction · n) articles go to eval and train (at least one
    when the fraction is > 0); the rest form the datastore.
    """
    if eval_fraction < 0 or train_fraction < 0 or eval_fraction + train_fraction >= 1:
        raise InputError(f"need 0 <= fractions and eval + train < 1, got {eval_fraction} and {train_fraction}")
    ids = [a.id for a in articles]
    if len(set(ids)) != len(ids):
        raise ValueError("article ids must be unique to split by article")
    n = len(articles)
    n_eval = max(1, round(eval_fraction * n)) if eval_fraction > 0 else 0
    n_train = max(1, round(train_fraction * n)) if train_fraction > 0 else 0
    if n_eval + n_train >= n:
        raise InputError(f"{n} articles are too few for {n_eval} eval and {n_train} train articles and a datastore")
    rank = sorted(range(n), key=lambda i: hashlib.sha256(f"{seed}:{ids[i]}".encode()).hexdigest())
    part = {i: "eval" for i in rank[:n_eval]} | {i: "train" for i in rank[n_eval:n_eval + n_train]}
    out = {"datastore": [], "eval": [], "train": []}
    for i, article in enumerate(articles):
        out[part.get(i, "datastore")].append(article)
    return out


def split_related(articles: Sequence[Document], eval_fraction: float = 0.1, train_fraction: float = 0.1,
                  held_out_fraction: float = 0.5, seed: int = 0) -> dict[str, list[Document]]:
    """Like `split_articles`, but the datastore also holds the opening part of every eval and train article.

    Each eval (train) article is cut at the paragraph boundary nearest `1 - held_out_fraction` of its
    characters: the opening goes to the datastore as "<id>#head", the rest is the held-out (training)
    document "<id>#tail". The scored text itself is never in the datastore, but text *related* to it is
    (the same article's other sections), so a retriever has something worth finding and LSR something
    to learn. Held-out windows exclude only their own source ("<id>#tail"), not the head.
    """
    if not 0 < held_out_fraction < 1:
        raise InputError(f"held_out_fraction must be in (0, 1), got {held_out_fraction}")
    parts = split_articles(articles, eval_fraction, train_fraction, seed)
    out = {"datastore": list(parts["datastore"]), "eval": [], "train": []}
    for name in ("eval", "train"):
        for article in parts[name]:
            head, tail = _cut_at_paragraph(article.text, 1 - held_out_fraction)
            if head:
                out["datastore"].append(Document(f"{article.id}#head", article.title, head))
            out[name].append(Document(f"{article.id}#tail", article.title, tail))
    return out


def _cut_at_paragraph(text: str, fraction: float) -> tuple[str, str]:
    """(opening, rest) of `text` cut at the paragraph boundary nearest `fraction` of its characters;
    the rest keeps at least one paragraph."""
    paragraphs = text.split("\n\n")
    ends = list(itertools.accumulate(len(p) + 2 for p in paragraphs[:-1]))  # offsets of the boundaries
    if not ends:
        return "", text
    cut = min(range(len(ends)), key=lambda i: abs(ends[i] - fraction * len(text)))
    return "\n\n".join(paragraphs[: cut + 1]), "\n\n".join(paragraphs[cut + 1 :])


def write_jsonl(docs: Iterable[Document], path: str) -> int:
    """Write {"id", "title", "text", the document's own fields} lines (read back by `retrieval.datastore.read_jsonl`),
    atomically; a file that already holds exactly these lines is left alone (its modification time too, so what was
    built from it is reused).

    Returns the number of documents.
    """
    lines = [json.dumps({"id": doc.id, "title": doc.title, "text": doc.text, **dict(doc.fields)}, ensure_ascii=False)
             + "\n"
             for doc in docs]
    data = "".join(lines).encode("utf-8")
    if os.path.isfile(path) and os.path.getsize(path) == len(data):
        with open(path, "rb") as f:
            if f.read() == data:
                return len(lines)
    with atomic_open(path, "wb") as f:
        f.write(data)
    return len(lines)

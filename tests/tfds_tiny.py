"""A TFDS builder for tests: a few documents written as an array_record dataset, with no network and no TensorFlow.

    prepare(documents, data_dir)  # then "tfds:replug_tiny_corpus:train:text:title" reads them back
"""
from __future__ import annotations

import tensorflow_datasets as tfds

NAME = "replug_tiny_corpus"


class ReplugTinyCorpus(tfds.core.GeneratorBasedBuilder):
    """Documents {"text", "title"} in one "train" split; set `documents` before preparing."""

    VERSION = tfds.core.Version("1.0.0")
    documents: list = []

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"text": tfds.features.Text(), "title": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for doc in self.documents:
            yield doc.id, {"text": doc.text, "title": doc.title}


def prepare(documents, data_dir: str) -> None:
    ReplugTinyCorpus.documents = list(documents)
    ReplugTinyCorpus(data_dir=data_dir, file_format="array_record").download_and_prepare()


class ReplugTinyQa(tfds.core.GeneratorBasedBuilder):
    """Questions shaped like trivia_qa (answer {"value", "aliases"}) in one "validation" split; set `records`."""

    VERSION = tfds.core.Version("1.0.0")
    records: list = []

    def _info(self):
        answer = tfds.features.FeaturesDict({"value": tfds.features.Text(),
                                             "aliases": tfds.features.Sequence(tfds.features.Text())})
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"question": tfds.features.Text(), "answer": answer}))

    def _split_generators(self, dl_manager):
        return {"validation": self._generate_examples()}

    def _generate_examples(self):
        yield from ((str(i), r) for i, r in enumerate(self.records))


class ReplugTinyQaList(ReplugTinyQa):
    """Questions shaped like natural_questions_open (answer: a sequence of strings), split "validation"."""

    records: list = []

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"question": tfds.features.Text(), "answer": tfds.features.Sequence(tfds.features.Text())}))


def prepare_qa(builder, records, data_dir: str) -> str:
    """Build one of the QA builders above from `records`; returns its TFDS name."""
    builder.records = list(records)
    built = builder(data_dir=data_dir, file_format="array_record")
    built.download_and_prepare()
    return built.name

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

"""The dense retriever's encoder as an object for notebooks and pipelines: text -> embeddings.

`DenseEncoder.embed(texts)` tokenises, sorts by length, pads to fixed length buckets and runs
`models.encoder.embed` over all devices. A batch never mixes buckets: each row is padded to its own, so its
embedding is the same bit for bit whatever is embedded with it (XLA's CPU programs round differently at another
padded length). Each bucket also runs one row count (`rows_per_call`: about 512 padded tokens on CPU, the whole
batch on accelerators): measured, a row's bits also depend on the rows around it in small calls wherever several CPU
devices share the process (benchmarks/README.md, "Embedding: rows per call"). Texts of up to 32 tokens share the
shortest bucket, so a batch of questions is one call, as fast as one question.
"""
from __future__ import annotations

import functools
import warnings

import numpy as np

from replug_jax.models import encoder as encoder_model, precision
from replug_jax.models.tokenizer import TextTokenizer
from replug_jax.models.weights import weights_fingerprint
from replug_jax.parallel import sharding, xla_cpu

TOKENS_PER_CALL = 512  # padded tokens a CPU call aims at: benchmarks/README.md, "Embedding: rows per call"
SHORTEST_BUCKET = 32  # texts of up to 32 tokens (questions) share one bucket: one call embeds 16 of them


def _embedded(params, ids, mask, *, config, normalize, dtype):
    return encoder_model.embed(params, config, ids, mask, normalize=normalize, dtype=dtype)


def embedding_function(config: encoder_model.BertConfig, normalize: bool, dtype):
    """`fn(params, ids, mask) -> [b, D]` embeddings: the program `embed` runs per length bucket (corpus and queries;
    `sharding.batch_program` jits it; the TPU plan compiles the same)."""
    return functools.partial(_embedded, config=config, normalize=normalize, dtype=dtype)


def rows_per_call(batch_size: int, tokens_per_call: int, length: int, devices: int) -> int:
    """Rows of every call at padded length `length`: about `tokens_per_call` tokens, at most the batch size, a
    multiple of the devices. One program per length, so a row's bits depend on its own length alone."""
    return min(batch_size, sharding.round_up(tokens_per_call // length, devices))


def accelerator_tokens_per_call(batch_size: int, max_length: int) -> int:
    """Tokens per call on accelerators: the whole batch at the longest length (their throughput wants full
    batches), so every bucket runs `batch_size` rows."""
    return batch_size * max_length


class DenseEncoder:
    """A BERT-family encoder with mean pooling; `normalize=True` makes inner products cosines (the paper's s(d, x))."""

    def __init__(self, config: encoder_model.BertConfig, params, tokenizer: TextTokenizer, *, name: str = "encoder",
                 max_length: int = 512, normalize: bool = True, batch_size: int = 32, length_multiple: int = 8,
                 tokens_per_call: int | None = None, dtype=None, param_dtype=None, mesh=None):
        """`dtype`: compute dtype (None: bf16 on accelerators, fp32 on CPU); `param_dtype`: the weights' (None:
        `dtype`); the pooled, normalised embeddings are float32 either way. `batch_size`: the most rows of one
        call; `tokens_per_call`: the padded tokens one call aims at (`rows_per_call`; None: TOKENS_PER_CALL on CPU
        devices, the whole batch on accelerators, whose throughput wants full batches)."""
        self.config, self.tokenizer, self.name, self.param_dtype = config, tokenizer, name, param_dtype
        self.max_length = min(max_length, config.max_position)
        params = precision.cast_floating(params, precision.weight_dtype(dtype, param_dtype))
        dtype = precision.resolve(dtype)
        self.normalize, self.length_multiple, self.dtype = normalize, length_multiple, dtype
        mesh = mesh or sharding.data_mesh()
        batch_size = sharding.round_up(batch_size, mesh.devices.size)
        if tokens_per_call is None:
            on_cpu = mesh.devices.flat[0].platform == "cpu"
            tokens_per_call = TOKENS_PER_CALL if on_cpu else accelerator_tokens_per_call(batch_size, self.max_length)
        self.tokens_per_call = tokens_per_call
        self._batch_fn = sharding.ShardedBatchFn(embedding_function(config, normalize, dtype), params, batch_size,
                                                 mesh, compiler_options=xla_cpu.options(xla_cpu.ENCODER, mesh))

    @property
    def params(self):
        return self._batch_fn.params

    @property
    def mesh(self):
        return self._batch_fn.mesh

    @property
    def dim(self) -> int:
        return self.config.hidden_size

    def tokenize(self, texts: list[str], max_length: int | None = None, warn: bool = True) -> list[list[int]]:
        """[CLS] text [SEP] ids, truncated to `max_length` (default: the encoder's; keeping [SEP]),
        with a warning when it truncates."""
        cap = min(max_length or self.max_length, self.max_length)
        rows = self.tokenizer.encode_batch(texts, add_special_tokens=True)
        long = sum(len(r) > cap for r in rows)
        if long:
            if warn:
                warnings.warn(f"{long} of {len(rows)} texts exceed {cap} encoder tokens and were truncated")
            rows = [r if len(r) <= cap else r[: cap - 1] + r[-1:] for r in rows]
        return rows

    def padded(self, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray]:
        """Fixed-shape ids and mask [N, length] (truncating silently): inputs of a jitted train step."""
        return sharding.pad_rows(self.tokenize(texts, length, warn=False), length, self.config.pad_token_id, len(texts))

    def with_params(self, params, name: str | None = None) -> "DenseEncoder":
        """The same encoder (tokenizer, settings, mesh) with other weights, e.g. a trained retriever."""
        return DenseEncoder(self.config, params, self.tokenizer, name=name or self.name, max_length=self.max_length,
                            normalize=self.normalize, batch_size=self._batch_fn.batch_size,
                            length_multiple=self.length_multiple, tokens_per_call=self.tokens_per_call,
                            dtype=self.dtype, param_dtype=self.param_dtype, mesh=self.mesh)

    def embed(self, texts: list[str], progress=False, params=None) -> np.ndarray:
        """Embeddings [N, D] float32 (unit rows if `normalize`); `params` overrides the weights (no recompile).
        `progress`: True for a bar of its own, or a callable told the rows each batch embedded."""
        if isinstance(texts, str):
            raise TypeError("embed takes a list of texts, not a single string")
        return self.embed_token_rows(self.tokenize(list(texts)), progress=progress, params=params)

    def embed_token_rows(self, rows: list[list[int]], progress=False, params=None) -> np.ndarray:
        """Embeddings of already-tokenised rows (with special tokens): [N, D] float32 (`progress` as `embed`)."""
        out = np.zeros((len(rows), self.dim), dtype=np.float32)
        params = None if params is None else self._batch_fn.place_params(params)
        batches = sharding.bucketed_batches(rows, self.rows_per_call, self.length_multiple, self.max_length,
                                            self.config.pad_token_id, progress is True, desc="embed", own_bucket=True,
                                            least=SHORTEST_BUCKET)
        for idx, ids, mask in batches:  # ids, mask: [rows, L]
            out[idx] = self._batch_fn(ids, mask, params=params, padded_rows=self.rows_per_call(ids.shape[1]))
            if callable(progress):
                progress(len(idx))
        return out

    def padded_length(self, tokens: int) -> int:
        """The padded length (bucket) of a text of `tokens` tokens: what its embedding's bits depend on."""
        return max(min(SHORTEST_BUCKET, self.max_length),
                   sharding.length_bucket(tokens, self.length_multiple, self.max_length))

    def rows_per_call(self, length: int) -> int:
        """Rows of every call at padded length `length` (`rows_per_call`)."""
        return rows_per_call(self._batch_fn.batch_size, self.tokens_per_call, length, self.mesh.devices.size)

    def fingerprint(self, params=None) -> str:
        """A short hash of the weights (`params` or the encoder's own, their dtypes included) and settings, the
        compute dtype among them; an index built with another encoder is refused."""
        return weights_fingerprint(self.params if params is None else params,
                                   [self.name, self.normalize, self.max_length, str(np.dtype(self.dtype))])

"""The black-box LM behind an OpenAI-compatible server: `client` (HTTPLM: scoring by the contract's one rule),
`transport` (JSON over HTTP, retries), `tokenization` (the server's /tokenize), `echo` (reading echoed prompt
log-probs), `windows` (the room a cut prompt keeps), `generation` (ensembled decoding), `probe` (what a server
returns and how to ask it). Standard library, numpy and the tokenizer: no JAX is imported here.
"""
from replug_jax.lm.http.client import HTTPLM  # noqa: F401 (the public name: from replug_jax.lm.http import HTTPLM)
from replug_jax.lm.http.transport import BlackBoxServerError  # noqa: F401

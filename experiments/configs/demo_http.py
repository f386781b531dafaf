"""The offline demo (demo.py) with the LM behind HTTP: REPLUG against a black box reachable only by its API.

Start our scoring server first (it serves SmolLM2-135M through the OpenAI completions contract),
wait for "serving ...", then run the evaluation against it:

    python -m replug_jax.serve --lm smollm2 --port 8000 &
    python -m replug_jax.main --config experiments/configs/demo_http.py --workdir runs/demo_http

Passages and evaluation windows are cut with `lm_tokenizer` (the server's model's tokenizer,
loaded locally; only its tokenizer, never its weights), so the windows are those of demo.py and
the perplexities match the local backend's (`--config.lm_tokenizer=` empty: the server's own /tokenize cuts
them, docs/http.md). Any OpenAI-compatible server that returns prompt
log-probabilities works: `--config.lm=http://HOST:PORT/v1` (the key, if any, from
$OPENAI_API_KEY); the client probes it first and refuses one whose log-probs are missing or misaligned.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "demo.py")
    c.lm = "http://127.0.0.1:8000/v1"  # rj.load_lm dispatches http(s) URLs to the HTTP backend
    c.lm_tokenizer = "smollm2"  # chunking and windows (as rj.load_tokenizer takes names)
    c.lm_prompts_per_request = 0  # prompts per completions request; 0: the probe decides (16 or 1)
    return c

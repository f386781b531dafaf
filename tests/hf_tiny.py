"""Tiny random Hugging Face PyTorch models saved to a directory: the references for our Flax models."""
from __future__ import annotations

import torch
import tokenizers
from tokenizers import models, pre_tokenizers, decoders

VOCAB = 260  # covers the 256 byte-level symbols + <|endoftext|>: one token per byte


def save_tiny_tokenizer(path: str, vocab_size: int = VOCAB) -> None:
    """A byte-level tokenizer without merges: one token per byte (ids < min(vocab_size, 257))."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<|endoftext|>": 0}
    for ch in sorted(alphabet)[: vocab_size - 1]:
        vocab[ch] = len(vocab)
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(f"{path}/tokenizer.json")


def save(model, path: str, shard: bool = False) -> None:
    torch.manual_seed(0)
    model.save_pretrained(path, max_shard_size="20KB" if shard else "10GB")
    save_tiny_tokenizer(path)


def tiny_bert(path: str, shard: bool = False):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, hidden_act="gelu")
    model = BertModel(cfg, add_pooling_layer=False).eval()
    save(model, path, shard)
    return model


def tiny_gpt2(path: str, shard: bool = False, positions: int = 64):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=positions,
                     resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    model = GPT2LMHeadModel(cfg).eval()
    save(model, path, shard)
    return model


LLAMA_SHAPE = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                   num_key_value_heads=2, max_position_embeddings=64)


def _tiny_llama_family(config_cls, model_cls, path: str, shard: bool, **config) -> torch.nn.Module:
    """A tiny random model of the Llama family saved to `path`; norm scales (and biases) random, not 1 (and 0), so
    a wrongly loaded norm or bias cannot hide."""
    torch.manual_seed(0)
    model = model_cls(config_cls(**LLAMA_SHAPE, **config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.uniform_(-0.5, 0.5)
    save(model, path, shard)
    return model


def tiny_llama(path: str, tie: bool = False, shard: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    return _tiny_llama_family(LlamaConfig, LlamaForCausalLM, path, shard, rope_theta=500.0, rms_norm_eps=1e-5,
                              tie_word_embeddings=tie)


def tiny_mistral(path: str, tie: bool = False, shard: bool = False, window: int = 8):
    """A tiny random Mistral (a Llama with a sliding attention window of `window` tokens)."""
    from transformers import MistralConfig, MistralForCausalLM

    return _tiny_llama_family(MistralConfig, MistralForCausalLM, path, shard, rope_theta=300.0, rms_norm_eps=1e-5,
                              tie_word_embeddings=tie, sliding_window=window)


def torch_logprobs(model, ids):
    """log p(token_t | tokens_<t) from a torch causal LM: [L] ids -> [L-1]."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()


def tiny_qwen2(path: str, tie: bool = False, shard: bool = False):
    """A tiny random Qwen2 (q/k/v biases, RoPE θ from the config)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _tiny_llama_family(Qwen2Config, Qwen2ForCausalLM, path, shard, rope_theta=250.0, rms_norm_eps=1e-6,
                              tie_word_embeddings=tie, use_sliding_window=False)


# Hugging Face Llama / Qwen2 tensor names -> llama.cpp's.
_GGUF_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def permute_rope_rows(w, num_heads: int):
    """llama.cpp's converter's Q/K row permutation for its `llama` architecture (interleaved RoPE): [out, in]."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def save_gguf(model, path: str, arch: str = "qwen2") -> None:
    """Write a torch Qwen2 (arch "qwen2") or Llama / Mistral (arch "llama") model as an f32 GGUF file the way
    llama.cpp's converter lays it out (llama: Q/K rows permuted; Mistral's window as attention.sliding_window),
    with a one-token-per-byte tokenizer in the metadata."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg.num_hidden_layers), w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size), w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads), w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"]), w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if getattr(cfg, "sliding_window", None) and cfg.model_type == "mistral":
        w.add_sliding_window(cfg.sliding_window)
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<|endoftext|>"] + alphabet[: VOCAB - 1]
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre(arch if arch == "qwen2" else "default"), w.add_token_list(tokens)
    w.add_token_merges([]), w.add_token_types([3] + [1] * (len(tokens) - 1)), w.add_eos_token_id(0)
    for name, tensor in model.state_dict().items():
        name = name.removeprefix("model.")
        array = tensor.float().numpy()
        if name.startswith("layers."):
            _, layer, rest = name.split(".", 2)
            module, kind = rest.rsplit(".", 1)
            name = f"blk.{layer}.{_GGUF_NAMES[module]}.{kind}"
            if arch == "llama" and module in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = cfg.num_attention_heads if module == "self_attn.q_proj" else cfg.num_key_value_heads
                array = permute_rope_rows(array, heads)
        else:
            name = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
                    "lm_head.weight": "output.weight"}[name]
        if name == "output.weight" and cfg.tie_word_embeddings:
            continue
        w.add_tensor(name, array)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


def compiled_programs(jitted) -> int:
    """How many executables a `jax.jit` function holds (1 when it compiled once). JAX exposes this only through a
    private method: tests use it, the library never does."""
    return jitted._cache_size()

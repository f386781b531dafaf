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


def tiny_llama(path: str, tie: bool = False, shard: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                      rope_theta=500.0, rms_norm_eps=1e-5, tie_word_embeddings=tie)
    model = LlamaForCausalLM(cfg).eval()
    # random norm scales, so a wrongly loaded norm cannot hide behind all-ones
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    save(model, path, shard)
    return model


def torch_logprobs(model, ids):
    """log p(token_t | tokens_<t) from a torch causal LM: [L] ids -> [L-1]."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()

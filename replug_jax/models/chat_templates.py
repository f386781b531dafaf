"""A model's chat template (Jinja) rendered over a chat history, as transformers' `apply_chat_template` renders it:
the template from the tokenizer (`TextTokenizer.chat_template`: a GGUF's `tokenizer.chat_template`, a Hugging Face
directory's tokenizer_config.json or chat_template.jinja), the special tokens by their text. lm-eval's
`--apply_chat_template` goes through it (harness/model.py)."""
from __future__ import annotations


def template_of(tokenizer) -> str | None:
    """The tokenizer's chat template, or None (a server's /tokenize gives none)."""
    return getattr(tokenizer, "chat_template", None) or None


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """`messages` ([{"role", "content"}, ...]) as the template writes them; with `add_generation_prompt` the
    assistant's turn opened after them, else the last message left open to be continued."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = template_of(tokenizer)
    if template is None:
        raise ValueError("this LM's tokenizer has no chat template")
    special = {f"{name}_token": tokenizer.backend.id_to_token(getattr(tokenizer, f"{name}_id"))
               for name in ("bos", "eos", "pad") if getattr(tokenizer, f"{name}_id", None) is not None}
    rendered, _ = render_jinja_template(conversations=[list(messages)], chat_template=template,
                                        add_generation_prompt=add_generation_prompt,
                                        continue_final_message=not add_generation_prompt, **special)
    return rendered[0]

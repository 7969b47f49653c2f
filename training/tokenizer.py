"""The shipped byte-level BPE tokenizer and its chat template.

Specials, in id order: ``<|endoftext|>`` (0: end of document, EOS and BOS), ``<|user|>`` (1),
``<|assistant|>`` (2), ``<|pad|>`` (3). A chat renders as
``<|endoftext|><|user|> {message} <|assistant|> {reply}<|endoftext|>`` — exactly the text the story
generator writes for its chat-wrapped stories (training packs documents after an
``<|endoftext|>``, so it doubles as the start token), so a prompt built with
``apply_chat_template(..., add_generation_prompt=True)`` ends where a reply starts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|user|>", "<|assistant|>", "<|pad|>")
VOCAB_SIZE = 8192
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "{{ '<|user|> ' + message['content'] + ' ' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{ '<|assistant|> ' + message['content'] + '<|endoftext|>' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path, max_length: int) -> None:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` (chat template inside) for AutoTokenizer."""
    from transformers import PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIAL_TOKENS[0], eos_token=SPECIAL_TOKENS[0],
        unk_token=None, pad_token=SPECIAL_TOKENS[3], model_max_length=max_length,
        additional_special_tokens=list(SPECIAL_TOKENS[1:3]), clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    # Keep the template inside tokenizer_config.json as well as any separate file transformers wrote,
    # so older and newer transformers both find it.
    import json
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    jinja = out_dir / "chat_template.jinja"
    if jinja.exists():
        jinja.unlink()

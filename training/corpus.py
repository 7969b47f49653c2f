"""Build the training corpus directory: prose splits, the tokenizer, pre-tokenized arrays.

    python -m training.corpus --out data/spice-mini
    python -m training.corpus --out data/spice-mini --tokenizer assets/spice-mini/tokenizer.json

writes (nothing of it is committed; it is rebuilt from installed packages and the generator):
    tokenizer/                 tokenizer.json, tokenizer_config.json (trained, or with ``--tokenizer``
                               copied byte for byte from beside the given file, so a second model
                               shares the first one's exact ids)
    prose/{domain}.{split}.npy uint16 token ids, documents joined by <|endoftext|>
    manifest.json              token counts per domain and split, the seeds used

Stories are not stored: training generates them on the fly (``training.data``) from seeds
below ``VALIDATION_SEED_BASE``; validation stories use seeds from it upward. Prose documents
are split deterministically: every ``VAL_EVERY``-th document (by order) is validation.
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from pathlib import Path

import numpy as np

from training import sources
from training.stories import generate_chat_story, generate_story, training_document
from training.tokenizer import SPECIAL_TOKENS, save_tokenizer, train_tokenizer

log = logging.getLogger(__name__)
VAL_EVERY = 20
VALIDATION_SEED_BASE = 10**12     # training story seeds stay far below this
TOKENIZER_STORY_DOCS = 40_000
EOS_ID = 0


def split_documents(docs: list[sources.Document]) -> dict[str, list[sources.Document]]:
    return {"train": [d for i, d in enumerate(docs) if i % VAL_EVERY != VAL_EVERY - 1],
            "val": [d for i, d in enumerate(docs) if i % VAL_EVERY == VAL_EVERY - 1]}


def encode_documents(tok, texts: list[str]) -> np.ndarray:
    """Token ids of ``texts``, each followed by <|endoftext|>, as one uint16 array."""
    out: list[int] = []
    for enc in tok.encode_batch(texts):
        out.extend(enc.ids)
        out.append(EOS_ID)
    return np.asarray(out, dtype=np.uint16)


def validation_stories(n: int, chat: bool) -> list[str]:
    """The held-out story documents (with special tokens), the same for every caller."""
    make = generate_chat_story if chat else generate_story
    offset = VALIDATION_SEED_BASE + (10**9 if chat else 0)
    return [make(offset + i).document() for i in range(n)]


class TokenizerFileError(Exception):
    """The tokenizer given to reuse cannot be used (the message says what to pass instead)."""


def reuse_tokenizer(tokenizer_json: Path, out_dir: Path):
    """Copy ``tokenizer.json`` and the ``tokenizer_config.json`` beside it into ``out_dir`` unchanged."""
    from tokenizers import Tokenizer

    config = tokenizer_json.with_name("tokenizer_config.json")
    if not tokenizer_json.is_file() or not config.is_file():
        raise TokenizerFileError(f"--tokenizer {tokenizer_json}: needs an existing tokenizer.json with a "
                                 f"tokenizer_config.json beside it (e.g. assets/spice-mini/tokenizer.json)")
    tok = Tokenizer.from_file(str(tokenizer_json))
    if [tok.token_to_id(t) for t in SPECIAL_TOKENS] != [0, 1, 2, 3]:
        raise TokenizerFileError(f"--tokenizer {tokenizer_json}: its special tokens are not {SPECIAL_TOKENS} "
                                 f"at ids 0-3; pass a tokenizer written by this corpus builder")
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_json, out_dir / "tokenizer.json")
    shutil.copyfile(config, out_dir / "tokenizer_config.json")
    return tok


def build(out_dir: Path, max_length: int = 512, tokenizer_json: Path | None = None) -> dict:
    """Write the corpus; with ``tokenizer_json`` that tokenizer is reused instead of training one."""
    t0 = time.time()
    prose = {domain: split_documents(sources.load_domain(domain)) for domain in sources.DOMAINS}
    if tokenizer_json is not None:
        tok = reuse_tokenizer(tokenizer_json, out_dir / "tokenizer")
    else:
        texts = [d.text for splits in prose.values() for d in splits["train"]]
        texts += [training_document(seed) for seed in range(TOKENIZER_STORY_DOCS)]
        tok = train_tokenizer(texts)
        save_tokenizer(tok, out_dir / "tokenizer", max_length)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]

    manifest: dict = {"vocab_size": tok.get_vocab_size(), "val_every": VAL_EVERY,
                      "tokenizer_from": str(tokenizer_json) if tokenizer_json is not None else None,
                      "validation_seed_base": VALIDATION_SEED_BASE, "tokens": {}, "documents": {}}
    (out_dir / "prose").mkdir(parents=True, exist_ok=True)
    for domain, splits in prose.items():
        for split, docs in splits.items():
            ids = encode_documents(tok, [d.text for d in docs])
            np.save(out_dir / "prose" / f"{domain}.{split}.npy", ids)
            manifest["tokens"][f"{domain}.{split}"] = int(ids.size)
            manifest["documents"][f"{domain}.{split}"] = len(docs)
    sample = [training_document(seed) for seed in range(2000)]
    manifest["story_tokens_per_document"] = float(np.mean([len(e.ids) for e in tok.encode_batch(sample)]))
    manifest["build_seconds"] = round(time.time() - t0, 1)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("data/spice-mini"))
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="reuse this tokenizer.json (and the tokenizer_config.json beside it) instead of training one")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        manifest = build(args.out, args.max_length, args.tokenizer)
    except (sources.SourceMissingError, TokenizerFileError) as e:
        log.error("%s", e)
        raise SystemExit(2) from None
    log.info(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()

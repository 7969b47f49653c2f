"""Write the shipped model's held-out data beside it, so the engine never imports this package.

    python -m training.export_heldout [--model-dir assets/spice-mini]

Writes ``<model-dir>/spice-heldout.json.gz``: the held-out stories (plain and chat-wrapped, as in
training) and prose chunks of the validation split, each cut into the "calibration" half (draft
heads and LoRE are fitted on it) and the "eval" half (benchmarks and quality), plus the prompts the
benchmarks open with and the stories of the long-context prompt. The engine reads it with
`spice_core.heldout`. The prose comes from the public-domain sources of `training.sources`, which
must be installed (see its INSTALL table): the file records which domains it found.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from training import sources
from training.corpus import VALIDATION_SEED_BASE, split_documents, validation_stories
from training.stories import generate_chat_story, generate_story

FORMAT = "spice-heldout-v1"
N_STORIES = 1500          # per half: what calibration takes
N_PROMPTS = 64            # bench's held-out prompts (the eval half's seeds)
N_LONG_STORIES = 64       # stories of the long-context prompt, back to back


def _stories(part: str, n: int) -> list[str]:
    """Held-out stories, plain and chat-wrapped 7:3 as in training; "calibration" takes the
    even-numbered ones, "eval" the odd ones."""
    k = 0 if part == "calibration" else 1
    plain = validation_stories(2 * n, chat=False)[k::2]
    chat = validation_stories(2 * n, chat=True)[k::2]
    return [chat[i] if i % 10 in (2, 5, 8) else plain[i] for i in range(n)]


def _prose(part: str, chunk_chars: int = 1200) -> tuple[list[str], list[str]]:
    """(chunks, domains found) of the prose validation split, ~``chunk_chars`` each, round-robin over
    domains; "calibration" takes the even-numbered documents, "eval" the odd ones."""
    k = 0 if part == "calibration" else 1
    by_domain, found = [], []
    for domain in sources.DOMAINS:
        try:
            docs = split_documents(sources.load_domain(domain))["val"][k::2]
        except sources.SourceMissingError as e:
            print(f"warning: held-out {domain} prose unavailable ({e})", file=sys.stderr)
            continue
        found.append(domain)
        chunks = []
        for d in docs:
            cur = ""
            for para in d.text.split("\n\n"):
                cur = f"{cur}\n\n{para}" if cur else para
                if len(cur) >= chunk_chars:
                    chunks.append(cur)
                    cur = ""
            if cur:
                chunks.append(cur)
        by_domain.append(chunks)
    return ([c for group in zip(*by_domain) for c in group] if by_domain else []), found


def _prompts(n: int) -> list[dict]:
    """Openings of eval-half stories and, every third, a held-out chat request."""
    out = []
    for i in range(n):
        seed = VALIDATION_SEED_BASE + 2 * i + 1          # odd held-out seeds: the eval half
        if i % 3 == 2:
            out.append({"chat": generate_chat_story(seed + 10**9).request.text})
        else:
            out.append({"text": ".".join(generate_story(seed).text.split(".")[:2]) + "."})
    return out


def build() -> dict:
    data = {"format": FORMAT, "stories": {}, "prose": {}, "prose_domains": {}}
    for part in ("calibration", "eval"):
        data["stories"][part] = _stories(part, N_STORIES)
        data["prose"][part], data["prose_domains"][part] = _prose(part)
    data["prompts"] = _prompts(N_PROMPTS)
    data["long_stories"] = [generate_story(VALIDATION_SEED_BASE + 2 * (1000 + i) + 1).text
                            for i in range(N_LONG_STORIES)]
    return data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=Path("assets/spice-mini"))
    args = ap.parse_args(argv)
    if not args.model_dir.is_dir():
        print(f"error: --model-dir {args.model_dir} is not a folder", file=sys.stderr)
        return 2
    out = args.model_dir / "spice-heldout.json.gz"
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump(build(), f, ensure_ascii=False, separators=(",", ":"))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

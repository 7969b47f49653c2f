"""Routing traces: what the target's routers see and decide, per token and MoE layer.

    texts ─► tokenizer ─► rows of <= seq_len tokens ─► target forward, experts run exactly from host weights
          ─► per MoE layer: MoE input x [N,H], router distribution p [N,E], selected experts [N,K]
          ─► RoutingTraces (with row id and position per token, so a target may cross the token boundary)

Consumers: the draft trainer (predictor/draft.py), LoRE fitting (spice_core.lore.fit), the
calibration statistics (popularity) and the predictor recall benchmark.

The calibration set, in order of preference: a user's text file (``--text``); for a shipped
model (spice-mini, spice-mini-qwen2, or a copy of one) its own held-out split (the data file beside
it, spice_core/heldout.py); for any other model a small built-in prompt set plus the default shipped
model's held-out stories. Each comes in two halves that share no text: "calibration" (the draft heads and LoRE are
fitted on it) and "eval" (quality and tune score on it).

This module does not know about policies, caches or timing: it only records what an exact
forward pass routes. It never changes the model: the engine's experts modules get a tracing
runtime for the duration of the pass and their previous runtime back afterwards.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch.nn import functional as F

from spice_core import heldout
from spice_core.errors import ArtifactError, ConfigError
from spice_core.exec.experts import expert_forward, installed
from spice_core.types import ExpertKey
from spice_core.user_files import file_problem

log = logging.getLogger(__name__)

DEFAULT_SEQ_LEN = 256
DEFAULT_MAX_TOKENS = 24_576
MIN_CALIBRATION_TOKENS = 64      # below this no head can be trained or checked meaningfully

BUILTIN_TEXTS = (
    "Once upon a time there was a little cat named Tom. He liked to play with a red ball in the garden. "
    "One day the ball rolled under the fence, and Tom had to ask his friend the dog for help.",
    "The committee met on Tuesday to discuss the budget for next year. After a long debate, they agreed "
    "to spend more on schools and less on roads, although several members voted against the plan.",
    "To make bread, mix flour, water, salt and yeast. Knead the dough for ten minutes, let it rise for an "
    "hour, shape it into a loaf, and bake it in a hot oven until the crust is brown.",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be "
    "in want of a wife. However little known the feelings or views of such a man may be on his first "
    "entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families.",
    "In the beginning God created the heavens and the earth. The earth was formless and empty. Darkness "
    "was on the surface of the deep and God's Spirit was hovering over the surface of the waters.",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
    "arrows of outrageous fortune, or to take arms against a sea of troubles, and by opposing end them.",
    "User: Can you tell me a story about a brave rabbit?\nAssistant: Of course. Once there was a rabbit "
    "named Lily who lived near a big forest. She was small, but she was very brave.",
    "The sun rose over the hills and the birds began to sing. Anna opened the window, smiled, and said, "
    "\"What a beautiful day! Let's go to the park and have a picnic by the lake.\"",
    "Water boils at one hundred degrees Celsius at sea level. At higher altitudes the air pressure is "
    "lower, so water boils at a lower temperature and food takes longer to cook.",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i * 2))\n",
    "The train left the station at seven o'clock. Through the window, Sam watched the fields, the farms "
    "and the little villages go by, and he wondered what the big city would be like.",
    "Mom said, \"Please clean your room before dinner.\" Ben sighed, picked up his toys one by one, and put "
    "them in the box. When he was done, the room looked bright and tidy, and Mom gave him a hug.",
    "1. Preheat the oven. 2. Grease the pan. 3. Pour in the batter. 4. Bake for thirty minutes. "
    "5. Let it cool before you cut it.",
    "The old lighthouse keeper climbed the stairs every night to light the lamp. Ships far out at sea "
    "saw the light and knew that the rocks were near, and they steered safely into the harbour.",
    "Dear Sir, I write to inform you that your order has been shipped and should arrive within five "
    "working days. Thank you for your patience. Yours faithfully, the Customer Service Team.",
    "Why is the sky blue? Sunlight is made of many colours. When it passes through the air, the blue "
    "light is scattered more than the red light, so we see blue light coming from every part of the sky.",
)


@dataclass
class RoutingTraces:
    """Per token and MoE layer: the MoE input and what the router made of it.

    Shapes (L MoE layers in ``moe_layers`` order, N tokens, H hidden, E experts, K top-k):
        hidden   [L,N,H]  the MoE block's input (float16, or float32 when float16 would overflow)
        probs    [L,N,E]  the router's full softmax distribution (float32)
        topk     [L,N,K]  the experts the router selected (int16)
        row, pos [N]      which packed row a token came from and its position in it: token i+1 is
                          the next token of token i iff row[i+1] == row[i]
    """

    moe_layers: tuple[int, ...]
    hidden: torch.Tensor
    probs: torch.Tensor
    topk: torch.Tensor
    row: torch.Tensor
    pos: torch.Tensor
    source: str = ""

    @property
    def n_tokens(self) -> int:
        return int(self.row.shape[0])

    @property
    def n_experts(self) -> int:
        return int(self.probs.shape[-1])

    @property
    def top_k(self) -> int:
        return int(self.topk.shape[-1])

    def layer_hidden(self, layer: int) -> torch.Tensor:
        """MoE input [N,H] of decoder layer ``layer`` (LoRE fitting reads traces per layer)."""
        return self.hidden[self.moe_layers.index(layer)]

    def hidden_by_layer(self) -> dict[int, torch.Tensor]:
        """{MoE layer: MoE inputs [N,H]}: the form LoRE fitting (spice_core.lore.fit) takes."""
        return {layer: self.hidden[p] for p, layer in enumerate(self.moe_layers)}

    def layer_probs(self, layer: int) -> torch.Tensor:
        return self.probs[self.moe_layers.index(layer)]

    def expert_frequency(self) -> torch.Tensor:
        """[L,E]: share of tokens that selected each expert."""
        L, _, K = self.topk.shape
        counts = torch.zeros(L, self.n_experts)
        counts.scatter_add_(1, self.topk.long().reshape(L, -1), torch.ones(L, self.topk[0].numel()))
        return counts / max(1, self.n_tokens)

    def popularity(self) -> list[ExpertKey]:
        """Every expert, most frequently routed first (ties: lower layer, then lower expert)."""
        freq = self.expert_frequency()
        order = sorted(((float(freq[p, e]), p, e) for p in range(freq.shape[0]) for e in range(freq.shape[1])),
                       key=lambda t: (-t[0], t[1], t[2]))
        return [ExpertKey(self.moe_layers[p], e) for _, p, e in order]

    def split_rows(self, eval_frac: float) -> tuple["RoutingTraces", "RoutingTraces"]:
        """(train, eval) by whole rows: the last ``eval_frac`` of the rows go to eval."""
        rows = torch.unique(self.row)
        n_eval = max(1, int(round(len(rows) * eval_frac))) if len(rows) > 1 else 0
        cut = rows[len(rows) - n_eval] if n_eval else rows.max() + 1
        return self.select(self.row < cut), self.select(self.row >= cut)

    def select(self, mask: torch.Tensor) -> "RoutingTraces":
        return RoutingTraces(self.moe_layers, self.hidden[:, mask], self.probs[:, mask], self.topk[:, mask],
                             self.row[mask], self.pos[mask], self.source)


class _TracingRuntime:
    """Stands in for the engine's LayerRuntime during a tracing pass: runs each selected expert
    from host weights exactly as the stock loop does, and records the router's view first."""

    def __init__(self, lm) -> None:
        self.lm = lm
        self.records: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {l: [] for l in lm.moe_layers}

    @torch.no_grad()
    def run_layer(self, layer: int, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, act):
        """x [T,H], top_k_index/top_k_weights [T,K] -> [T,H]."""
        gate = self.lm.moe_block(layer).gate
        # Every supported router is softmax(x W^T) (DeepSeek-V2 in float32): recompute the full
        # distribution here, since not every transformers version returns the router logits.
        probs = torch.softmax(F.linear(x.float(), gate.weight.float()), dim=-1)
        self.records[layer].append((x.detach().float().cpu(), probs.cpu(), top_k_index.detach().cpu().to(torch.int16)))
        return host_experts_forward(self.lm, layer, x, top_k_index, top_k_weights, act)


@torch.no_grad()
def host_experts_forward(lm, layer: int, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                         act) -> torch.Tensor:
    """One MoE layer's routed experts from their host weights, as transformers' eager loop computes them
    (each selected expert copied to x's device for the call): x [T,H], top_k_index/weights [T,K] -> [T,H]."""
    final = torch.zeros_like(x)
    for e in torch.unique(top_k_index).tolist():
        if not 0 <= e < lm.n_experts:
            continue
        toks, poss = torch.where(top_k_index == e)
        gate_up, down = (w.to(x.device, non_blocking=True) for w in lm.host.weights(ExpertKey(layer, e)))
        y = expert_forward(x[toks], gate_up, down, act) * top_k_weights[toks, poss, None]
        final.index_add_(0, toks, y.to(final.dtype))
    return final


def pack_rows(token_ids: Sequence[int], seq_len: int = DEFAULT_SEQ_LEN) -> list[list[int]]:
    """Cut one token stream into rows of ``seq_len`` (the last row may be shorter, min 2 tokens)."""
    if seq_len < 2:
        raise ConfigError(f"seq_len={seq_len} is too small: use at least 2")
    rows = [list(token_ids[i:i + seq_len]) for i in range(0, len(token_ids), seq_len)]
    return [r for r in rows if len(r) >= 2]


def tokenize_texts(lm, texts: Sequence[str], *, seq_len: int = DEFAULT_SEQ_LEN,
                   max_tokens: int | None = None) -> list[list[int]]:
    """Texts joined by the tokenizer's end-of-text token, packed into rows."""
    tok = lm.tokenizer
    if tok is None:
        raise ConfigError(f"model {lm.name} has no tokenizer files: calibration needs one to read text "
                          "(use a checkpoint folder that includes its tokenizer)")
    eos = tok.eos_token_id
    stream: list[int] = []
    for t in texts:
        if not t.strip():
            continue
        stream.extend(tok(t, add_special_tokens=False, verbose=False)["input_ids"])
        if eos is not None and not (tok.eos_token and t.endswith(tok.eos_token)):
            stream.append(int(eos))
        if max_tokens is not None and len(stream) >= max_tokens:
            break
    if max_tokens is not None:
        stream = stream[:max_tokens]
    return pack_rows(stream, seq_len)


@torch.no_grad()
def collect_traces(lm, rows: Sequence[Sequence[int]], *, batch_rows: int = 4, source: str = "") -> RoutingTraces:
    """Run the exact target over ``rows`` (token ids) and record every MoE layer's routing.

    Raises ConfigError for an empty set and ArtifactError when no token reached a MoE layer.
    """
    rows = [list(r) for r in rows if len(r) > 0]
    if not rows:
        raise ConfigError("the calibration set is empty (no tokens): pass a --text file with some text in it")
    rt = _TracingRuntime(lm)
    row_ids, positions = [], []
    with installed(lm, rt):
        # Equal-length rows batch together without padding.
        by_len: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            by_len.setdefault(len(r), []).append(i)
        for length in sorted(by_len):
            idx = by_len[length]
            for b in range(0, len(idx), batch_rows):
                chunk = idx[b:b + batch_rows]
                ids = torch.tensor([rows[i] for i in chunk], device=lm.device)
                lm.model(input_ids=ids, use_cache=False)
                for i in chunk:
                    row_ids.append(torch.full((length,), i, dtype=torch.int32))
                    positions.append(torch.arange(length, dtype=torch.int32))
    n = sum(len(r) for r in rows)
    if any(sum(x.shape[0] for x, _, _ in rt.records[layer]) != n for layer in lm.moe_layers):
        raise ArtifactError(
            f"the calibration pass over {n} tokens never reached some MoE layer of {lm.name}: "
            "the model's MoE blocks are not wired to the engine; reload it with spice_core's loader")
    hidden = torch.stack([torch.cat([x for x, _, _ in rt.records[layer]]) for layer in lm.moe_layers])
    if hidden.abs().max() < 6e4:
        hidden = hidden.half()
    probs = torch.stack([torch.cat([p for _, p, _ in rt.records[layer]]) for layer in lm.moe_layers])
    topk = torch.stack([torch.cat([k for _, _, k in rt.records[layer]]) for layer in lm.moe_layers])
    row = torch.cat(row_ids)
    pos = torch.cat(positions)
    # Batches were formed by length: restore the (row, position) order so next tokens are adjacent.
    order = torch.argsort(row.long() * (max(len(r) for r in rows) + 1) + pos.long())
    return RoutingTraces(tuple(lm.moe_layers), hidden[:, order], probs[:, order], topk[:, order], row[order],
                         pos[order], source)


# ---------------------------------------------------------------- calibration text sets
def shipped_folder(lm) -> Path | None:
    """The folder of the shipped model ``lm`` is, or is a copy of (same router weights as its calibration
    record), else None: a shipped model calibrates and evaluates on its own held-out split."""
    from spice_core.model.shipped import present_models
    from spice_core.predictor.artifacts import model_fingerprint

    here = Path(lm.path).resolve()
    models = present_models()
    for m in models:
        if here == m.folder.resolve():
            return m.folder
    for m in models:
        try:
            shipped = json.loads((m.folder / "spice-calibration.json").read_text()).get("fingerprint")
        except (OSError, ValueError):
            continue
        if isinstance(shipped, dict) and shipped.get("n_experts") == lm.n_experts \
                and model_fingerprint(lm).get("router_sha256") == shipped.get("router_sha256"):
            return m.folder
    return None


def is_shipped_model(lm) -> bool:
    """A shipped model itself, or a copy of one (see `shipped_folder`)."""
    return shipped_folder(lm) is not None


def read_text_file(path: Path) -> list[str]:
    """A user's calibration text: documents separated by blank lines."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--text {path}: {file_problem(path)}: pass a UTF-8 text file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"--text {path}: not UTF-8 text ({e}): convert it to UTF-8") from e
    docs = [d.strip() for d in text.split("\n\n")]
    docs = [d for d in docs if d]
    if not docs:
        raise ConfigError(f"--text {path}: the file is empty: pass a file with some text in it")
    return docs


def _shipped_heldout_texts(part: str, model_dir: Path | None = None) -> tuple[list[str], str] | None:
    """A shipped model's held-out split (default: the default shipped model's), mixed as in training (~85%
    stories, 30% of them chat-wrapped, ~15% prose by tokens), read from the data file beside it
    (spice_core.heldout).

    ``part`` "calibration" (draft training) and "eval" (benchmarks) are disjoint halves.
    None when the file is missing.
    """
    if heldout.load_heldout(model_dir) is None:
        return None
    stories = heldout.stories(part, model_dir=model_dir)
    prose, domains = heldout.prose(part, model_dir)
    texts, pi = [], 0
    for i, story in enumerate(stories):    # one prose chunk after every 8 stories: ~15% of tokens
        texts.append(story)
        if i % 8 == 7 and pi < len(prose):
            texts.append(prose[pi])
            pi += 1
    what = "stories" + (f" + {'/'.join(domains)} prose" if domains else "")
    whose = f"{model_dir.name}'s" if model_dir is not None else "the shipped model's"
    return texts, f"{whose} held-out split ({what}; {part} half)"


def calibration_texts(lm, text_file: Path | None = None, part: str = "calibration",
                      model_dir: Path | None = None) -> tuple[list[str], str]:
    """(texts, description) of the calibration set for ``lm`` (see the module docstring). ``model_dir``: the
    shipped folder whose held-out split to read when ``lm`` is not itself one (a miniature lifted to full shapes)."""
    if text_file is not None:
        return read_text_file(text_file), f"text file {Path(text_file).name}"
    folder = model_dir or shipped_folder(lm)
    if folder is not None:
        got = _shipped_heldout_texts(part, folder)
        if got is not None:
            return got
    # Halves that never meet, as the shipped splits': quality scored on text the draft heads and LoRE were fitted
    # on would flatter them.
    half = len(BUILTIN_TEXTS) // 2
    texts = list(BUILTIN_TEXTS[half:] if part == "eval" else BUILTIN_TEXTS[:half])
    which = "eval" if part == "eval" else "calibration"
    if heldout.load_heldout() is not None:
        texts += heldout.stories(part, 400)
        return texts, f"built-in prompt set and the shipped model's held-out stories ({which} half)"
    return texts, f"built-in prompt set ({which} half)"


def traces_for_model(lm, *, text_file: Path | None = None, max_tokens: int = DEFAULT_MAX_TOKENS,
                     seq_len: int = DEFAULT_SEQ_LEN, part: str = "calibration") -> RoutingTraces:
    """Tokenize the calibration set for ``lm`` and trace it (at most ``max_tokens`` tokens)."""
    if max_tokens < 2:
        raise ConfigError(f"--max-tokens {max_tokens} is too small: use at least a few thousand tokens")
    texts, source = calibration_texts(lm, text_file, part)
    rows = tokenize_texts(lm, texts, seq_len=seq_len, max_tokens=max_tokens)
    n = sum(len(r) for r in rows)
    if n < MIN_CALIBRATION_TOKENS:
        raise ConfigError(f"the calibration set ({source}) has only {n} tokens, fewer than {MIN_CALIBRATION_TOKENS}: "
                          "pass a --text file with more text (a few thousand tokens or more)")
    log.info("tracing %d tokens of %s", sum(len(r) for r in rows), source)
    return collect_traces(lm, rows, source=source)

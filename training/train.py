"""Train the shipped model from scratch (one GPU, minutes), resumable.

    python -m training.corpus --out data/spice-mini            # tokenizer + prose arrays (once)
    python -m training.train --data data/spice-mini --out runs/spice-mini --minutes 7.7
    python -m training.train --data data/spice-mini --out runs/qwen2 --config qwen2-mini --minutes 7.7
    python -m training.export --run runs/spice-mini --data data/spice-mini --out assets/spice-mini

Mechanics, and why:
- bf16 weights for the forward/backward, fp32 master weights in the optimizer (AdamW):
  bf16 updates alone lose small steps; the model is small, so the fp32 copy is cheap.
- transformers' DeepSeek-V2 computes no load-balancing loss and does not return router
  logits (Qwen2-MoE does only with ``output_router_logits``, which the configs leave off), so
  forward hooks on every MoE layer's router (``mlp.gate`` in both families, returning
  ``(router_logits, top_k_weights, top_k_index)``) capture ``(router_logits [T,E], top_k_index [T,k])``
  and the same Switch-style loss ``E * sum_e f_e * P_e`` (f: share of routed slots, P: mean router
  probability) is added for either family.
- ``--config`` picks the family too (``mini``/``tiny``: DeepSeek-V2, ``qwen2-mini``/``qwen2-tiny``:
  Qwen2-MoE, see ``training.model_config``); everything else is the same for both.
- The learning rate follows *training time*, not a step count (warm-up, then cosine to 10%
  at ``--minutes``), so the run ends annealed whatever throughput the machine gives.
- Every ``--save-every-s`` seconds and at the end: bf16 weights as safetensors shards plus
  ``train_state.json`` into ``--out`` (few files, each < 16 MB), and a full checkpoint
  (fp32 masters, optimizer, step, time used) into ``--ckpt-dir``; ``--resume`` continues from it.
- A hard ``--deadline-s`` (seconds since start) stops training and saves, whatever else.
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from training.data import MixConfig, MixedBatches

log = logging.getLogger("training.train")
# The keys of training.model_config.CONFIGS, spelled out so parsing flags imports no transformers/torch.
CONFIG_NAMES = ("mini", "tiny", "qwen2-mini", "qwen2-tiny")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from spice_core.tools import args as ca      # finite numbers in range, refused as they are parsed

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("data/spice-mini"))
    ap.add_argument("--out", type=Path, default=Path("runs/spice-mini"))
    ap.add_argument("--ckpt-dir", type=Path, default=None, help="full checkpoints (default: <out>/ckpt)")
    ap.add_argument("--config", default="mini", choices=CONFIG_NAMES,
                    help="model family and size (training.model_config)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--minutes", type=ca.positive_float, default=7.7, help="training time the LR schedule spans")
    ap.add_argument("--max-steps", type=ca.int_in(0), default=0, help="stop after this many steps (0: time only)")
    ap.add_argument("--deadline-s", type=ca.float_in(0.0), default=0.0, help="hard stop, seconds after start (0: none)")
    ap.add_argument("--batch", type=ca.positive_int, default=128, help="rows per step")
    ap.add_argument("--seq", type=ca.int_in(2), default=512)
    ap.add_argument("--lr", type=ca.positive_float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=ca.fraction, default=0.1)
    ap.add_argument("--warmup-steps", type=ca.int_in(0), default=60)
    ap.add_argument("--weight-decay", type=ca.float_in(0.0), default=0.1)
    ap.add_argument("--aux-coef", type=ca.float_in(0.0), default=0.01, help="load-balancing loss weight")
    ap.add_argument("--clip", type=ca.positive_float, default=1.0)
    ap.add_argument("--prose-fraction", type=ca.fraction, default=0.15)
    ap.add_argument("--chat-fraction", type=ca.fraction, default=0.3)
    ap.add_argument("--workers", type=ca.int_in(0), default=max(1, min(8, (os.cpu_count() or 2) - 2)),
                    help="story generator processes (0: generate in this process)")
    ap.add_argument("--save-every-s", type=ca.positive_float, default=120.0)
    ap.add_argument("--log-every", type=ca.positive_int, default=10)
    ap.add_argument("--seed", type=ca.seed, default=0)
    ap.add_argument("--story-seed-offset", type=ca.int_in(0), default=0,
                    help="first story seed (a second stage uses fresh stories by starting elsewhere)")
    ap.add_argument("--experts", default="grouped_mm", choices=("grouped_mm", "eager"),
                    help="transformers experts implementation (falls back to eager if grouped_mm fails)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start from a saved model directory (a second training stage) instead of random weights")
    return ap.parse_args(argv)


class RouterCapture:
    """Forward hooks on each MoE layer's router; holds this step's (logits [T,E], top-k [T,k])."""

    def __init__(self, model) -> None:
        self.captured: list[tuple] = []
        self.handles = [layer.mlp.gate.register_forward_hook(self._hook)
                        for layer in model.model.layers if hasattr(layer.mlp, "gate")]

    def _hook(self, module, inputs, output) -> None:
        self.captured.append((output[0], output[2]))

    def load_balance_loss(self, num_experts: int):
        import torch

        total = 0.0
        for logits, topk in self.captured:
            # T tokens, E experts, K active
            probs = logits.float().softmax(dim=-1)                                  # [T,E]
            counts = torch.zeros(num_experts, device=logits.device, dtype=torch.float32)
            counts.scatter_add_(0, topk.reshape(-1), torch.ones(topk.numel(), device=logits.device))
            share = counts / topk.numel()                                           # f_e, sums to 1
            total = total + num_experts * (share * probs.mean(dim=0)).sum()
        self.captured.clear()
        return total / max(1, len(self.handles))


def lr_at(frac: float, step: int, args) -> float:
    """Warm-up over ``warmup_steps`` steps, then cosine from ``lr`` to ``min_lr_frac * lr`` over time."""
    warm = min(1.0, (step + 1) / max(1, args.warmup_steps))
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return args.lr * warm * (args.min_lr_frac + (1 - args.min_lr_frac) * cos)


def export_weights(model, out_dir: Path, max_shard_bytes: int = 14_000_000) -> list[str]:
    """bf16 state dict as a few safetensors shards (tied lm_head left out); returns file names."""
    import torch
    from safetensors.torch import save_file

    sd = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    shards: list[dict] = [{}]
    size = 0
    for key in sorted(sd):
        nbytes = sd[key].numel() * 2
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = sd[key]
        size += nbytes
    names = []
    for i, shard in enumerate(shards):
        name = f"weights-{i + 1:02d}-of-{len(shards):02d}.safetensors"
        tmp = out_dir / (name + ".tmp")
        save_file(shard, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, out_dir / name)
        names.append(name)
    return names


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


class CheckpointError(Exception):
    """The checkpoint to resume from cannot be used (the message says what to do)."""


def save_checkpoint(path: Path, *, step: int, tokens: int, train_seconds: float, masters: list,
                    optimizer: dict) -> None:
    """The full training state (fp32 masters, optimizer state) as plain tensors, numbers and
    containers only, so `load_checkpoint` can read it with ``weights_only=True``."""
    import torch

    tmp = path.with_name(path.name + ".tmp")
    torch.save({"step": int(step), "tokens": int(tokens), "train_seconds": float(train_seconds),
                "masters": list(masters), "optimizer": optimizer}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    """A checkpoint written by `save_checkpoint`. ``weights_only=True``: torch's restricted unpickler
    rebuilds tensors and plain containers and refuses anything that could run code."""
    import pickle

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(f"--resume: {path} is not a checkpoint this script wrote ({type(e).__name__}): "
                              "move it away to start fresh") from e
    if not isinstance(state, dict) or not {"step", "tokens", "train_seconds", "masters", "optimizer"} <= set(state):
        raise CheckpointError(f"--resume: {path} lacks the training state: move it away to start fresh")
    return state


def main(argv: list[str] | None = None) -> int:
    t_start = time.time()
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    if not (args.data / "manifest.json").exists():
        log.error("%s is not a corpus directory (no manifest.json): build it first with "
                  "`python -m training.corpus --out %s`", args.data, args.data)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = args.ckpt_dir or args.out / "ckpt"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((args.data / "manifest.json").read_text())

    resume_state = None
    if args.resume and (ckpt_dir / "last.pt").exists():
        try:
            resume_state = load_checkpoint(ckpt_dir / "last.pt")
        except CheckpointError as e:
            log.error("%s", e)
            return 2
        log.info("resuming from step %d (%.0f s trained)", resume_state["step"], resume_state["train_seconds"])
    step0 = resume_state["step"] if resume_state else 0

    # Data workers first: they must fork/spawn before CUDA is initialised.
    batches = MixedBatches(args.data, MixConfig(
        seq_len=args.seq, batch_rows=args.batch, prose_fraction=args.prose_fraction,
        chat_fraction=args.chat_fraction, workers=args.workers, seed=args.seed + step0,
        first_story_seed=args.story_seed_offset + step0 * args.batch * 16))

    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import AutoModelForCausalLM

    from training.model_config import build_config

    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    cfg = build_config(args.config, manifest["vocab_size"], args.seq)
    if args.init_from:
        model = AutoModelForCausalLM.from_pretrained(str(args.init_from), dtype=torch.bfloat16,
                                                     use_safetensors=True).to(device)
        cfg = model.config
        log.info("initialised from %s", args.init_from)
    else:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(device)
    model.config._experts_implementation = args.experts
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().float().clone() for p in params]
    decay = [m for p, m in zip(params, masters) if p.ndim >= 2]
    no_decay = [m for p, m in zip(params, masters) if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    train_seconds = 0.0
    tokens = 0
    if resume_state:
        for m, saved in zip(masters, resume_state["masters"]):
            m.copy_(saved)
        opt.load_state_dict(resume_state["optimizer"])
        train_seconds, tokens = resume_state["train_seconds"], resume_state["tokens"]
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m)
    n_params = sum(p.numel() for p in params)
    num_experts = cfg.num_experts        # both families (DeepSeek maps it to n_routed_experts)
    capture = RouterCapture(model)
    budget_s = args.minutes * 60
    log.info("model %s: %d parameters (%.1f MB bf16), %d MoE layers; device %s; torch %s transformers %s",
             args.config, n_params, n_params * 2 / 1e6, len(capture.handles),
             torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
             torch.__version__, transformers.__version__)

    def forward_loss(rows: np.ndarray):
        x = torch.from_numpy(rows.astype(np.int64)).to(device, non_blocking=True)
        logits = model(input_ids=x[:, :-1], use_cache=False).logits
        lm = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        aux = capture.load_balance_loss(num_experts)
        return lm, aux

    def save(step: int, final: bool, extra: dict) -> None:
        files = export_weights(model, args.out)
        state = {
            "config": cfg.to_dict(), "step": step, "tokens": tokens, "train_seconds": round(train_seconds, 1),
            "wall_seconds": round(time.time() - t_start, 1), "final": final, "weight_files": files,
            "parameters": n_params, "batch_rows": args.batch, "seq_len": args.seq, "lr": args.lr,
            "aux_coef": args.aux_coef, "prose_fraction": args.prose_fraction, "chat_fraction": args.chat_fraction,
            "experts_implementation": model.config._experts_implementation, "rows_by_source": batches.rows_by_source,
            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
            "init_from": str(args.init_from) if args.init_from else None, "story_seed_offset": args.story_seed_offset,
            "min_lr_frac": args.min_lr_frac, "warmup_steps": args.warmup_steps, "minutes": args.minutes,
            "torch": torch.__version__, "transformers": transformers.__version__, **extra,
        }
        write_json(args.out / "train_state.json", state)
        save_checkpoint(ckpt_dir / "last.pt", step=step, tokens=tokens, train_seconds=train_seconds,
                        masters=masters, optimizer=opt.state_dict())
        log.info("saved step %d (%s)", step, ", ".join(files))

    # One trial step with the fast experts kernel; fall back to the eager loop if it fails here.
    first = next(batches)
    if args.experts == "grouped_mm":
        try:
            lm, aux = forward_loss(first[:2])
            (lm + aux).backward()
        except Exception as e:  # noqa: BLE001 - any kernel failure means: use the reference loop
            log.warning("grouped_mm experts failed (%s: %s); using eager experts", type(e).__name__, e)
            model.config._experts_implementation = "eager"
        model.zero_grad(set_to_none=True)
        capture.captured.clear()

    loss_log = open(args.out / "loss.csv", "a", newline="")
    writer = csv.writer(loss_log)
    if step0 == 0:
        writer.writerow(["step", "tokens", "train_seconds", "lm_loss", "aux_loss", "lr", "tokens_per_s"])
    step, last_save, window_t, window_tok = step0, time.time(), time.time(), 0
    sums = torch.zeros(2, device=device)
    rows = first
    stop_reason = "time budget"
    while True:
        t0 = time.time()
        lr = lr_at(train_seconds / budget_s if not args.max_steps else step / args.max_steps, step, args)
        for g in opt.param_groups:
            g["lr"] = lr
        lm, aux = forward_loss(rows)
        (lm + args.aux_coef * aux).backward()
        with torch.no_grad():
            for p, m in zip(params, masters):
                m.grad = p.grad.float()
                p.grad = None
            torch.nn.utils.clip_grad_norm_(masters, args.clip)
            opt.step()
            for p, m in zip(params, masters):
                p.copy_(m)
                m.grad = None
            sums += torch.stack([lm.detach(), aux.detach()])
        step += 1
        tokens += rows.shape[0] * args.seq
        window_tok += rows.shape[0] * args.seq
        rows = next(batches)
        if device.type == "cuda" and step % args.log_every == 0:
            torch.cuda.synchronize()
        train_seconds += time.time() - t0
        if step % args.log_every == 0:
            lm_avg, aux_avg = (sums / args.log_every).tolist()
            sums.zero_()
            tps = window_tok / (time.time() - window_t)
            window_t, window_tok = time.time(), 0
            writer.writerow([step, tokens, round(train_seconds, 1), round(lm_avg, 4), round(aux_avg, 4),
                             f"{lr:.3g}", round(tps)])
            loss_log.flush()
            log.info("step %d tokens %.2fM loss %.3f aux %.3f lr %.2e %.0f tok/s queue %d", step, tokens / 1e6,
                     lm_avg, aux_avg, lr, tps, batches.queue.qsize() if hasattr(batches.queue, "qsize") else -1)
        if args.max_steps and step >= args.max_steps:
            stop_reason = "max steps"
            break
        if not args.max_steps and train_seconds >= budget_s:
            break
        if args.deadline_s and time.time() - t_start >= args.deadline_s:
            stop_reason = "deadline"
            break
        if time.time() - last_save >= args.save_every_s:
            save(step, False, {})
            last_save = time.time()
    batches.close()
    loss_log.close()
    log.info("stopped at step %d (%s): %.1fM tokens in %.0f s of training", step, stop_reason, tokens / 1e6,
             train_seconds)
    save(step, True, {"stop_reason": stop_reason,
                      "mean_tokens_per_s": round((tokens - (resume_state or {}).get("tokens", 0)) /
                                                 max(1e-9, train_seconds - (resume_state or {}).get("train_seconds", 0)))})
    for h in capture.handles:
        h.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())

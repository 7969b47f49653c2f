"""Turn a training run's output into the shipped model directory.

    python -m training.export --run runs/stage1 --run runs/stage2 --data data/spice-mini --out assets/spice-mini

Loads the last run's bf16 shards into a fresh model of its config's family (DeepSeek-V2 or
Qwen2-MoE, ``training.model_config.config_from_dict``) and writes it with
``save_pretrained(max_shard_size="8MB")`` (files stay under 9 MB: the largest tensor, the 2 MB tied
embedding, is far below the limit) — transformers then stores the routed experts under per-expert keys
(``model.layers.L.mlp.experts.E.gate_proj.weight``) like the real DeepSeek-V2-Lite and Qwen2-57B-A14B
checkpoints — plus the generation config, the tokenizer, the merged
loss log, each stage's ``train_state.json`` (as ``training_stage{n}.json``) and a SHA-256 manifest
(``checksums.sha256``) that ``checkpoint_check.verify_checkpoint`` reads.
The model card is written separately (``training.model_card``), after evaluation.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)
MAX_SHARD_SIZE = "8MB"
CHECKSUMS = "checksums.sha256"


def load_run_model(run_dir: Path):
    """The trained model (bf16, eval mode) from a run directory's shards and train_state.json."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from training.model_config import config_from_dict

    state = json.loads((run_dir / "train_state.json").read_text())
    cfg = config_from_dict(state["config"])
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    sd = {}
    for name in state["weight_files"]:
        sd.update(load_file(str(run_dir / name)))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"run weights do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    return model.eval(), state


def write_checksums(model_dir: Path) -> None:
    lines = []
    for path in sorted(model_dir.iterdir()):
        # Only what export and the model card write: calibration files added later are not listed.
        if path.is_file() and (path.name.startswith(("model", "config", "generation_config", "tokenizer", "training_"))
                               or path.name == "eval.json") and path.suffix in (".safetensors", ".json"):
            lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}")
    (model_dir / CHECKSUMS).write_text("\n".join(lines) + "\n")


def merge_loss_logs(run_dirs: list[Path], out_path: Path) -> None:
    """One CSV of all stages' loss logs, with a ``stage`` column (1 = the first run)."""
    import csv

    with out_path.open("w", newline="") as f:
        writer = csv.writer(f)
        for stage, run_dir in enumerate(run_dirs, start=1):
            with (run_dir / "loss.csv").open() as src:
                rows = list(csv.reader(src))
            if stage == 1:
                writer.writerow(["stage"] + rows[0])
            writer.writerows([str(stage)] + row for row in rows[1:])


def export(run_dirs: list[Path], data_dir: Path, out_dir: Path) -> dict:
    """Export the weights of the last run in ``run_dirs`` (earlier ones are earlier training stages)."""
    from transformers import GenerationConfig

    from training.model_config import ARCHITECTURES

    model, state = load_run_model(run_dirs[-1])
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("model*.safetensors*"):
        old.unlink()
    model.config.architectures = [ARCHITECTURES[model.config.model_type]]
    model.generation_config = GenerationConfig(
        bos_token_id=0, eos_token_id=0, pad_token_id=3, max_new_tokens=256, do_sample=False)
    model.save_pretrained(str(out_dir), max_shard_size=MAX_SHARD_SIZE)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(data_dir / "tokenizer" / name, out_dir / name)
    merge_loss_logs(run_dirs, out_dir / "training_loss.csv")
    for stage, run_dir in enumerate(run_dirs, start=1):
        shutil.copy(run_dir / "train_state.json", out_dir / f"training_stage{stage}.json")
    write_checksums(out_dir)
    return state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, action="append", required=True,
                    help="training output; repeat for several stages, in order (the last one's weights are exported)")
    ap.add_argument("--data", type=Path, default=Path("data/spice-mini"))
    ap.add_argument("--out", type=Path, default=Path("assets/spice-mini"), help="model directory to write")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    export(args.run, args.data, args.out)
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()

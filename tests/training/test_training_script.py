"""The training script end to end on a tiny config: trains, saves, resumes, exports per-expert keys."""
import json
import shutil

import numpy as np

from training import export, train
from training.checkpoint_check import verify_checkpoint
from training.stories import training_document


def _data_dir(tmp_path, shipped_dir):
    from tokenizers import Tokenizer

    data = tmp_path / "data"
    (data / "tokenizer").mkdir(parents=True)
    (data / "prose").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(shipped_dir / name, data / "tokenizer" / name)
    tok = Tokenizer.from_file(str(data / "tokenizer" / "tokenizer.json"))
    ids = [i for e in tok.encode_batch([training_document(s) for s in range(40)]) for i in e.ids]
    np.save(data / "prose" / "fake.train.npy", np.asarray(ids, dtype=np.uint16))
    (data / "manifest.json").write_text(json.dumps({"vocab_size": tok.get_vocab_size()}))
    return data


def test_tiny_training_run_saves_resumes_and_exports(tmp_path, shipped_dir):
    data = _data_dir(tmp_path, shipped_dir)
    run = tmp_path / "run"
    common = ["--data", str(data), "--out", str(run), "--config", "tiny", "--device", "cpu", "--batch", "2",
              "--seq", "32", "--workers", "0", "--log-every", "1"]
    assert train.main(common + ["--max-steps", "2"]) == 0
    state = json.loads((run / "train_state.json").read_text())
    assert state["step"] == 2 and state["tokens"] == 2 * 2 * 32 and state["final"]
    assert train.main(common + ["--max-steps", "3", "--resume"]) == 0
    state = json.loads((run / "train_state.json").read_text())
    assert state["step"] == 3
    losses = (run / "loss.csv").read_text().splitlines()
    assert losses[0].startswith("step,") and len(losses) == 4

    out = tmp_path / "model"
    export.export([run], data, out)
    verify_checkpoint(out)
    keys = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"] \
        if (out / "model.safetensors.index.json").exists() else None
    if keys is None:
        from safetensors import safe_open
        keys = list(safe_open(str(out / "model.safetensors"), "pt").keys())
    assert "model.layers.1.mlp.experts.7.gate_proj.weight" in keys

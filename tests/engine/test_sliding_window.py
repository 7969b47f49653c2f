"""A checkpoint whose attention uses a sliding window (Mixtral's config field): the graphed executor cannot build
its per-layer mask, so asking for it falls back to the eager executor with a note, on the CPU as on CUDA, and the
tokens stay stock transformers' (it raised a shape error from inside attention on the CPU)."""
import torch
from transformers import AutoModelForCausalLM

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine
from tiny_models import save_tiny_tokenizer, tiny_config

PROMPT = [5, 17, 33, 2, 9, 41, 7, 8, 12, 30, 22, 6]


def test_sliding_window_model_on_the_graphed_executor_falls_back_to_eager(tmp_path):
    cfg = tiny_config("mixtral")
    cfg.sliding_window = 4                  # shorter than the prompt: the window matters
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
    model.save_pretrained(tmp_path)
    save_tiny_tokenizer(tmp_path, cfg.vocab_size)
    with torch.no_grad():
        ref = model.generate(torch.tensor([PROMPT]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                             pad_token_id=0)[0, len(PROMPT):].tolist()
    eng = SpiceEngine.load(tmp_path, device="cpu", executor="graphed")
    run = eng.start_ids(PROMPT, RunSettings(policy="lru", cache_frac=0.5, max_new_tokens=12))
    assert [s.token_id for s in run] == ref
    assert any("fast path off" in n and "sliding-window" in n for n in run.summary().notes)

"""Model adapters: find MoE layers in transformers models, load checkpoints into the
offloaded layout, and hold the few per-family differences."""

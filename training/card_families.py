"""What a model card says that depends on the model's family: the real model it miniaturises, the
shape table, the training history and the commands that reproduce it.

    config (training_stage*.json) ─► shape_fields ─► ShapeRow templates ─► | miniature | real model |
    CardFamily.real (the real model's config numbers) ───────────────────►

One ``CardFamily`` per config ``model_type`` (each family ships one miniature). Everything that
is measured (eval.json) is rendered the same way for every family by ``training.model_card``;
this module holds only text and the real models' published numbers, and knows nothing about
evaluation. Text fields are ``str.format`` templates over the miniature's shape fields, its
``folder`` and a few measured numbers (``followed``, ``requests``, ``object_copy_probability``).
"""
from __future__ import annotations

from dataclasses import dataclass

from spice_core.errors import UnsupportedModelError


@dataclass(frozen=True)
class ShapeRow:
    label: str
    mini: str                   # template over the miniature's shape fields
    real: str | None = None     # template over ``CardFamily.real``; None: the same as ``mini``


@dataclass(frozen=True)
class CardFamily:
    name: str                   # the shipped miniature, e.g. "spice-mini"
    real_name: str              # the model whose topology it keeps
    real: dict                  # the real model's config numbers (its config.json) for the shape table
    topology: str               # what is kept, for "exactly the topology of ... (<topology>)"
    shape_rows: tuple[ShapeRow, ...]
    keys: str                   # the per-expert key names of the shards
    loading: str                # how to load it (and how fast, where measured)
    balance_loss: str           # why the balance loss needs hooks in this family
    prose: str                  # what its prose continuations are like, for "What it is"
    history: str                # bullets after the stage lines: why the stages are what they are
    reproduce: str              # the commands, as one bullet's continuation lines
    limitations: tuple[str, ...]    # bullets specific to this model, after the first shared one


def shape_fields(cfg: dict) -> dict:
    """The config's values plus the derived ones the templates use (``renorm``, ``rope_theta``,
    ``dense_layers``); works on a miniature's saved config and on ``CardFamily.real`` alike."""
    out = dict(cfg)
    out["renorm"] = "renormalised" if cfg.get("norm_topk_prob") else "no renormalisation"
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" in rope:
        out["rope_theta"] = f"{rope['rope_theta']:,.0f}"
    if cfg.get("model_type") == "qwen2_moe":    # a layer is dense if listed or off the sparse step
        step, dense = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or ())
        out["dense_layers"] = sum(i in dense or (i + 1) % step != 0 for i in range(cfg["num_hidden_layers"]))
    return out


_COMMON_ROWS = (
    ShapeRow("vocabulary", "{vocab_size:,} (byte-level BPE, tied embeddings)", "{vocab_size:,}"),
    ShapeRow("context (max_position_embeddings)", "{max_position_embeddings} tokens (trained at {seq_len})",
             "{context}"),
    ShapeRow("parameters / bf16 bytes", "{parameters:,} / {checkpoint_bytes:,}", "{size}"),
)

DEEPSEEK_V2 = CardFamily(
    name="spice-mini",
    real_name="DeepSeek-V2-Lite",
    real=dict(model_type="deepseek_v2", num_hidden_layers=27, first_k_dense_replace=1, n_routed_experts=64,
              num_experts_per_tok=6, topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0,
              n_shared_experts=2, hidden_size=2048, moe_intermediate_size=1408, intermediate_size=10944,
              num_attention_heads=16, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
              vocab_size=102400, context="32k+", size="15.7B / 31 GB"),
    topology=("{num_hidden_layers} layers, the first dense, {n_routed_experts} routed experts with {topk_method} "
              "top-{num_experts_per_tok} routing and no\nrenormalisation, {n_shared_experts} shared experts, MLA "
              "attention with `qk_rope_head_dim` {qk_rope_head_dim} and no query LoRA"),
    shape_rows=(
        ShapeRow("layers (dense first)", "{num_hidden_layers} ({first_k_dense_replace})"),
        ShapeRow("routed experts, top-k, routing",
                 "{n_routed_experts}, {num_experts_per_tok}, {topk_method}, {renorm}, scaling {routed_scaling_factor}",
                 "{n_routed_experts}, {num_experts_per_tok}, {topk_method}, {renorm}, {routed_scaling_factor}"),
        ShapeRow("shared experts", "{n_shared_experts}"),
        ShapeRow("hidden / expert width / dense width", "{hidden_size} / {moe_intermediate_size} / {intermediate_size}"),
        ShapeRow("attention", "MLA, {num_attention_heads} heads, kv_lora_rank {kv_lora_rank}, qk_nope "
                 "{qk_nope_head_dim}, qk_rope {qk_rope_head_dim}, v {v_head_dim}",
                 "MLA, {num_attention_heads} heads, {kv_lora_rank}, {qk_nope_head_dim}, {qk_rope_head_dim}, "
                 "{v_head_dim}"),
    ) + _COMMON_ROWS,
    keys="per-expert\nkeys `model.layers.L.mlp.experts.E.{{gate,up,down}}_proj.weight` as in the real checkpoint",
    loading=("Load with `AutoModelForCausalLM.from_pretrained(\"{folder}\")` (transformers ≥ 5.17). On a CPU, "
             "decoding is\nfastest with `dtype=torch.float32, experts_implementation=\"batched_mm\"`; measured "
             "speeds are in\n`docs/benchmarks/shipped-model-cpu.md` (`benchmarks/cpu_speed_shipped.py`)."),
    balance_loss="transformers' DeepSeek-V2 computes none",
    prose="its prose continuations are pastiche",
    history="""\
- Why two stages: after stage 1 the model copied the requested *kind* of hero (a cat) but never the requested
  *object*: the teacher-forced probability of the requested object where a held-out chat story first names it
  was 0.005 on that generator's chats, and every greedy story got the same "toy train". The generator was then
  changed to name a requested object in the sentence after the opening ("She loved her ball very much."), and
  stage 2 continued from stage 1's weights with more chat stories. On the current generator's held-out chats
  (`training.evaluate.object_copy_probability`) the probability is 0.00001 for the stage-1 weights and 0.984
  for the shipped ones.""",
    reproduce="""\
`python -m training.corpus --out data/spice-mini`; stage 1
  `python -m training.train --data data/spice-mini --out runs/stage1 --minutes 7.6 --batch 128 --seq 512`
  (it used the generator of commit 5acfd9e, before the object sentence was added);
  `python -m training.export --run runs/stage1 --out runs/stage1-model`; stage 2
  `python -m training.train --data data/spice-mini --out runs/stage2 --init-from runs/stage1-model --minutes 2.7
  --lr 1e-3 --warmup-steps 30 --chat-fraction 0.6 --story-seed-offset 10000000000 --seed 1`; then
  `python -m training.export --run runs/stage1 --run runs/stage2 --out assets/spice-mini` and
  `python -m training.model_card --model assets/spice-mini --run runs/stage1 --run runs/stage2`.""",
    limitations=(
        """Chat means only the story-request format it was trained on; other questions get a story anyway.
  Greedy decoding settles on the same few names ("Wendy") and plots whatever the request; sample
  (temperature 0.8) for variety.""",
    ),
)

QWEN2_MOE = CardFamily(
    name="spice-mini-qwen2",
    real_name="Qwen2-57B-A14B",
    real=dict(model_type="qwen2_moe", num_hidden_layers=28, mlp_only_layers=[], num_experts=64,
              num_experts_per_tok=8, norm_topk_prob=False, hidden_size=3584, moe_intermediate_size=2560,
              shared_expert_intermediate_size=20480, num_attention_heads=28, num_key_value_heads=4, head_dim=128,
              rope_parameters={"rope_theta": 1000000.0}, vocab_size=151936, max_position_embeddings=131072,
              context="131,072", size="57.4B / 115 GB"),
    topology=("{num_hidden_layers} layers, all MoE, {num_experts} routed experts with softmax "
              "top-{num_experts_per_tok} routing and\n{renorm}, one shared expert behind a sigmoid gate, "
              "grouped-query attention with q/k/v biases and\nhead dim {head_dim}, rope theta {rope_theta}"),
    shape_rows=(
        ShapeRow("layers (dense)", "{num_hidden_layers} ({dense_layers})"),
        ShapeRow("routed experts, top-k, routing", "{num_experts}, {num_experts_per_tok}, softmax, {renorm}"),
        ShapeRow("shared expert", "1, behind a sigmoid gate"),
        ShapeRow("hidden / expert width / shared expert width",
                 "{hidden_size} / {moe_intermediate_size} / {shared_expert_intermediate_size}"),
        ShapeRow("attention", "GQA, {num_attention_heads} query / {num_key_value_heads} key-value heads of "
                 "{head_dim}, q/k/v biases, rope theta {rope_theta}"),
    ) + _COMMON_ROWS,
    keys=("per-expert\nkeys `model.layers.L.mlp.experts.E.{{gate,up,down}}_proj.weight`, the shared expert under\n"
          "`model.layers.L.mlp.shared_expert.*` and its gate `mlp.shared_expert_gate.weight`, as in the real "
          "checkpoint"),
    loading="Load with `AutoModelForCausalLM.from_pretrained(\"{folder}\")` (transformers ≥ 5.17).",
    balance_loss="transformers' Qwen2-MoE computes one only with `output_router_logits`, which the config leaves off",
    prose="its prose continuations soon fall into loops",
    history="""\
- Why three stages: after stage 1 the model did not follow story requests (0 of 16 greedy replies named both
  the requested kind of hero and the requested object; the teacher-forced probability of the requested object
  where a held-out chat story first names it, `training.evaluate.object_copy_probability`, was 0.006), like
  spice-mini after its first stage ("Why two stages" in its card). Stage 2, spice-mini's second-stage recipe
  (from stage 1's weights, peak LR 0.001, 60% of stories chat-wrapped), raised that probability to 0.133 but
  followed 1 of 16; stage 3 continued from stage 2's weights with 80% chat-wrapped stories and fresh story
  seeds, and brought it to {object_copy_probability:.3f}, with {followed} of {requests} greedy replies below
  following the request. (The stage-1 and stage-2 figures were measured right after each stage with the same
  functions, `request_following` and `object_copy_probability`.)""",
    reproduce="""\
`python -m training.corpus --out data/spice-mini --tokenizer assets/spice-mini/tokenizer.json`
  (spice-mini's corpus and tokenizer); stage 1
  `python -m training.train --data data/spice-mini --out runs/qwen2-mini --config qwen2-mini --minutes 4.5
  --deadline-s 305 --batch 128 --seq 512 --lr 3e-3 --chat-fraction 0.5 --workers 10 --save-every-s 600`;
  `python -m training.export --run runs/qwen2-mini --data data/spice-mini --out runs/q2-stage1`; stage 2
  `python -m training.train --data data/spice-mini --out runs/q2s2 --config qwen2-mini --init-from runs/q2-stage1
  --minutes 4.0 --deadline-s 270 --batch 128 --seq 512 --lr 1e-3 --warmup-steps 30 --chat-fraction 0.6
  --story-seed-offset 10000000000 --seed 1 --workers 10`;
  `python -m training.export --run runs/qwen2-mini --run runs/q2s2 --data data/spice-mini --out runs/q2-stage2`;
  stage 3 `python -m training.train --data data/spice-mini --out runs/q2s3 --config qwen2-mini --init-from
  runs/q2-stage2 --minutes 4.5 --deadline-s 300 --batch 128 --seq 512 --lr 1e-3 --warmup-steps 30
  --chat-fraction 0.8 --story-seed-offset 20000000000 --seed 2 --workers 12`;
  `python -m training.export --run runs/qwen2-mini --run runs/q2s2 --run runs/q2s3 --data data/spice-mini
  --out assets/spice-mini-qwen2`; `python -m spice_core calibrate --model assets/spice-mini-qwen2 --threads 1
  --lore-max-rank 4`; then `python -m training.model_card --model assets/spice-mini-qwen2`.""",
    limitations=(
        """A story's names drift: the bear introduced as Olive is Meg a paragraph later, and a cat named Adam
  remembers a sick friend also called Adam.""",
        """Requests for a plot rather than a hero and an object ("a girl who is afraid of the dark") get a story of
  its own choosing, and many replies share the same few plots.""",
        """Its Austen, Bible and Shakespeare continuations soon fall into loops ("I am a king, and I am a king."
  over and over).""",
    ),
)

FAMILIES = {"deepseek_v2": DEEPSEEK_V2, "qwen2_moe": QWEN2_MOE}


def family_for(cfg: dict) -> CardFamily:
    model_type = cfg.get("model_type")
    if model_type not in FAMILIES:
        raise UnsupportedModelError(f"no model card text for config model_type {model_type!r}: add a CardFamily "
                                    f"for it to training.card_families (known: {sorted(FAMILIES)})")
    return FAMILIES[model_type]

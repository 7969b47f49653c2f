"""bench's "runs" blocks: each block of a config resolved against the config's own values, and the order bench runs
them in (`block_units`). Pure: config values in, blocks out."""
from __future__ import annotations

from typing import NamedTuple

from spice_core.errors import ConfigError


class Block(NamedTuple):
    """One "runs" block of a bench config, resolved against the config's own values."""

    links: list
    budgets: list
    policies: list
    workloads: list          # (workload, prompt index, token ids)
    max_new: int
    reps: int
    host_aware: bool
    variant: str
    executor: str
    cpu_lane: bool
    settings: dict           # the thresholds of SETTING_DEFAULTS
    lane_offer: str = "auto"     # SpiceEngine's: "auto" or "always"
    prefetch_admission: str = "exact"   # SpiceEngine's: "exact" or "all"
    teacher_forced: bool | list = False   # quality passes (bench_quality.py): all policies, a list of them, or none


def block_units(blocks: list[Block], interleave: bool) -> list[tuple]:
    """The order bench runs its blocks in: (block index, link, repetition, budget, workload) units, each the block's
    policies back to back on one prompt. The blocks one after the other; ``interleave``: every block on a prompt
    before any block takes the next (links, budgets and workloads in the order they first appear, then blocks)."""
    units = [(i, link, rep, budget, w) for i, b in enumerate(blocks) for link in b.links for rep in range(b.reps)
             for budget in b.budgets for w in b.workloads]
    if interleave:
        first: dict = {}
        for u in units:
            for part in (("link", u[1]), ("budget", u[3]), ("workload", u[4][:2])):
                first.setdefault(part, len(first))
        units.sort(key=lambda u: (first[("link", u[1])], u[2], first[("budget", u[3])], first[("workload", u[4][:2])],
                                  u[0]))
    return units


SETTING_DEFAULTS = {"tau_prefetch": 0.2, "tau_approx": 0.0, "max_lookahead": 4, "lore_rank": 16}   # config or block


def resolve_blocks(cfg: dict, policies: list, budgets: list, links: list, workloads: list, n_prompts: int,
                   max_new: int, reps: int, shard: tuple[int, int]) -> list[Block]:
    """The config's "runs" (or the config itself, as one block), each narrowed to its policies, budgets, links and
    prompts (``workloads``: (workload, prompt index, token ids), the long prompt last), this shard's prompts only
    (``shard``: (K, N) keeps prompts K, K+N, ...)."""
    blocks: list[Block] = []
    for i_block, b in enumerate(cfg.get("runs") or [{}]):
        pols = b.get("policies", policies)
        n_p = int(b.get("n_prompts", n_prompts))
        wl = [w for w in workloads if w[0] == "prompts"][:n_p]
        if "prompt_indices" in b:
            wanted = set(b["prompt_indices"])
            missing = sorted(wanted - {w[1] for w in wl})
            if missing:
                raise ConfigError(f"runs[{i_block}] \"prompt_indices\" {missing} are beyond the {len(wl)} prompts this "
                                  "block has: raise \"prompts\" or \"n_prompts\"")
            wl = [w for w in wl if w[1] in wanted]
        if b.get("long_prompt", True):
            wl += [w for w in workloads if w[0] == "long"]
        wl = [w for w in wl if w[1] % shard[1] == shard[0]]
        blocks.append(Block(
            links=b.get("links", links), budgets=[float(x) for x in b.get("budgets", budgets)], policies=pols,
            workloads=wl, max_new=int(b.get("max_new_tokens", max_new)), reps=int(b.get("repetitions", reps)),
            host_aware=bool(b.get("host_aware", cfg.get("host_aware", True))), variant=str(b.get("variant", "")),
            executor=str(b.get("executor", cfg.get("executor", "auto"))),
            cpu_lane=bool(b.get("cpu_lane", cfg.get("cpu_lane", True))),
            settings={k: b.get(k, cfg.get(k, d)) for k, d in SETTING_DEFAULTS.items()},
            lane_offer=str(b.get("lane_offer", cfg.get("lane_offer", "auto"))),
            prefetch_admission=str(b.get("prefetch_admission", cfg.get("prefetch_admission", "exact"))),
            teacher_forced=b.get("teacher_forced", cfg.get("teacher_forced", False))))
    return blocks

"""What each named policy is made of. Pure data: the planner and the engine compose from it.

    policy          cache      miss handling            predictor   eviction
    resident        all        (never misses)           -           -
    on_demand       none       copy, not kept           -           -
    lru             LRU        copy, kept               -           lru
    cpu_compute     static     CPU lane                 -           (static: popular experts)
    gate_prefetch   cache      copy                     gate        farthest predicted next use
    spice_prefetch  cache      copy                     draft       farthest predicted next use
    oracle_prefetch cache      copy                     oracle      farthest predicted next use
    spice           cache      approx / CPU / copy      draft       farthest predicted next use
    spice_no_lore   cache      CPU / copy               draft       farthest predicted next use
    spice_no_cpu    cache      approx / copy            draft       farthest predicted next use

Only ``spice`` may also run a miss on the CPU lane from the int8 weight-only copy (``use_int8``; lossy,
below its own threshold tau_int8, default off): every exact policy (no LoRE) leaves it out, and so does
spice_no_cpu, which has no lane.
"""
from __future__ import annotations

from dataclasses import dataclass

from spice_core.errors import ConfigError


@dataclass(frozen=True)
class PolicySpec:
    name: str
    preload_all: bool = False
    keep_misses: bool = True          # admit copied misses into the cache
    static_cache: bool = False        # cache filled once (cpu_compute) and never changed
    miss_mode: str = "copy"           # "copy" | "cpu" | "orchestrate"
    predictor: str | None = None      # None | "gate" | "draft" | "oracle"
    eviction: str = "lru"
    use_lore: bool = False
    use_cpu: bool = False
    use_int8: bool = False            # may take the lossy cpu_int8 miss action (needs use_cpu; never exact)

    @property
    def prefetches(self) -> bool:
        return self.predictor is not None


POLICY_SPECS = {
    s.name: s for s in (
        PolicySpec("resident", preload_all=True),
        PolicySpec("on_demand", keep_misses=False),
        PolicySpec("lru"),
        PolicySpec("cpu_compute", static_cache=True, miss_mode="cpu", use_cpu=True),
        PolicySpec("gate_prefetch", predictor="gate", eviction="farthest_next_use"),
        PolicySpec("spice_prefetch", predictor="draft", eviction="farthest_next_use"),
        PolicySpec("oracle_prefetch", predictor="oracle", eviction="farthest_next_use"),
        PolicySpec("spice", predictor="draft", eviction="farthest_next_use", miss_mode="orchestrate",
                   use_lore=True, use_cpu=True, use_int8=True),
        PolicySpec("spice_no_lore", predictor="draft", eviction="farthest_next_use", miss_mode="orchestrate",
                   use_cpu=True),
        PolicySpec("spice_no_cpu", predictor="draft", eviction="farthest_next_use", miss_mode="orchestrate",
                   use_lore=True),
    )
}


def get_spec(name: str) -> PolicySpec:
    if name not in POLICY_SPECS:
        raise ConfigError(f"policy={name!r} is unknown: choose one of {', '.join(POLICY_SPECS)}")
    return POLICY_SPECS[name]

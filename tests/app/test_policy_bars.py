"""The sweep's policies-side-by-side bars show each policy's fastest usable setting, not its exact one."""
from pages import figures_sweep


def _row(policy, tau, agreement, tpot):
    return {"policy": policy, "tau_prefetch": 0.2, "tau_approx": tau, "agreement": agreement, "tpot_ms": tpot,
            "hit_rate": 0.5}


def test_each_policy_shows_its_fastest_setting_within_the_agreement_floor_labelled():
    rows = [_row("spice", 0.0, 1.0, 57.0), _row("spice", 0.1, 0.95, 21.7), _row("spice", 0.2, 0.6, 15.0),
            _row("lru", 0.0, 1.0, 60.0), _row("odd", 0.2, 0.5, 30.0), _row("odd", 0.1, 0.7, 40.0)]
    fig = figures_sweep.policy_bars(rows, "modeled")
    bars = fig["data"][0]
    got = dict(zip(bars["x"], bars["y"]))
    assert got == {"spice": 21.7, "lru": 60.0, "odd": 40.0}       # odd has none >= 0.9: its highest agreement
    labels = dict(zip(bars["x"], bars["text"]))
    assert labels["spice"] == "τ_approx 0.1 · agreement 95%"

"""The Machine value: every modeled-or-measured, profile, link and executor question has one answer."""
import pytest

from spice_core.errors import ConfigError
from spice_core.machine import MEASURED_DEFAULT_PROFILE, MEASURED_FAST_PROFILE, Machine
from spice_core.timing.profiles import get_profile


def test_measured_on_cuda_modeled_elsewhere_and_a_pass_of_the_engine_is_modeled():
    assert Machine.resolve("cuda").timing == "measured" and Machine.resolve("cpu").timing == "modeled"
    m = Machine.resolve("cuda")
    assert m.run_timing() == "measured" and m.run_timing(modeled_pass=True) == "modeled"


@pytest.mark.parametrize("kw, field", [({"device": "cpu", "timing": "measured"}, "timing='measured'"),
                                       ({"device": "cpu", "timing": "sometimes"}, "timing="),
                                       ({"device": "cpu", "timing": "modeled", "executor": "fast"}, "executor="),
                                       ({"device": "cpu", "timing": "modeled", "link_gbps": -1.0}, "link_gbps=")])
def test_bad_machines_are_refused_naming_the_setting(kw, field):
    with pytest.raises(ConfigError, match=field):
        Machine(**kw)


def test_the_fast_path_is_the_default_only_for_measured_cuda_runs():
    assert Machine.resolve("cuda").fast_path() and not Machine.resolve("cuda").fast_path(modeled_pass=True)
    assert not Machine.resolve("cpu").fast_path()
    assert Machine.resolve("cpu", executor="graphed").fast_path()
    assert not Machine.resolve("cuda", executor="eager").fast_path()


def test_decision_profiles_follow_the_executor_and_the_link_and_a_users_profile_wins():
    m = Machine.resolve("cuda", link_gbps=13.0)
    assert m.decision_profile(fast=False).host_plan_us == get_profile(MEASURED_DEFAULT_PROFILE).host_plan_us
    assert m.decision_profile(fast=True).host_plan_us == get_profile(MEASURED_FAST_PROFILE).host_plan_us
    assert m.decision_profile(fast=True).h2d_pinned_gbps == 13.0
    mine = get_profile("rtx4090-pcie4x16")
    assert Machine.resolve("cuda", hw_profile=mine).decision_profile(fast=True).host_plan_us == mine.host_plan_us
    assert m.pace_extra_ms_per_byte() > 0 and Machine.resolve("cuda").pace_extra_ms_per_byte() == 0.0

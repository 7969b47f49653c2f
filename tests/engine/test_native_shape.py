"""The app offers the `native` shape (the loaded model's own dimensions) at its default 25% cache. On the
shipped miniature the draft heads and LoRE factors, charged at native size, take more than that budget
leaves beside one layer's experts; the run goes on without them and says why, instead of failing."""
from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine


def test_spice_at_the_native_shape_and_default_cache_runs_without_its_artifacts_and_says_so():
    eng = SpiceEngine.load(None, device="cpu")
    run = eng.start_prompt("Tell me a story about a cat", RunSettings(policy="spice", shape="native",
                                                                      max_new_tokens=4))
    steps = list(run)
    notes = eng.get_summary(run.run_id).notes
    assert len(steps) == 4
    assert any("do not fit in this GPU cache" in n and "raise the GPU cache" in n for n in notes), notes
    assert not any("--" in n for n in notes if "do not fit" in n)          # names the control, not a CLI flag

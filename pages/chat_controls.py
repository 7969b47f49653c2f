"""The chat page's settings side bar: one control per RunSettings field the app exposes, and the note
under them. The sliders' ranges are the app's ranges (pages/common.SLIDER_RANGES)."""
from __future__ import annotations

import gradio as gr

from spice_core.api import EngineInfo, RunSettings
from pages import chat_text as text
from pages.common import (LORE_RANKS, SLIDER_RANGES, FreeDropdown, FreeSlider, policy_choices, shape_choices,
                          shape_info)
from pages.limits import Limits


# A slider's value applies on its `release`, which Gradio sends when the range is let go (pointerup) or the
# number box is left (blur). From the keyboard: Enter in the box, or an arrow / Page / Home / End key on the
# range, sends the same (installed once per page).
KEYS_JS = """() => {
  if (window.spiceSliderKeys) return [];
  window.spiceSliderKeys = true;
  const RANGE_KEYS = ['ArrowLeft', 'ArrowRight', 'ArrowUp', 'ArrowDown', 'PageUp', 'PageDown', 'Home', 'End'];
  const release = (el) => el.dispatchEvent(new PointerEvent('pointerup', {bubbles: true}));
  document.addEventListener('keydown', (e) => {
    const t = e.target;
    if (e.key === 'Enter' && t.matches && t.matches('#spice-controls input[type=number]')) release(t);
  }, true);
  document.addEventListener('keyup', (e) => {
    const t = e.target;
    if (RANGE_KEYS.includes(e.key) && t.matches && t.matches('#spice-controls input[type=range]')) release(t);
  }, true);
  return [];
}"""


def _slider(name: str) -> dict:
    low, high, step = SLIDER_RANGES[name]
    return {"minimum": low, "maximum": high, "step": step}


class ChatControls:
    """Built inside the side bar; ``values`` are the settings controls in SETTING_FIELDS order."""

    def __init__(self, info: EngineInfo, d: RunSettings, limits: Limits) -> None:
        lore_ranks = tuple(getattr(info, "lore_ranks", ()) or LORE_RANKS)
        with gr.Group():
            self.policy = FreeDropdown(policy_choices(info), value=d.policy, label="Policy",
                                       info="baselines, and SPICE with parts switched off", elem_id="ctl-policy")
            self.cache_frac = FreeSlider(**_slider("cache_frac"), value=d.cache_frac, label="GPU cache size",
                                         info="share of all routed experts that fit on the GPU",
                                         elem_id="ctl-cache")
            self.tau_prefetch = FreeSlider(**_slider("tau_prefetch"), value=d.tau_prefetch, label="τ_prefetch",
                                           info="prefetch an expert when the draft is at least this confident",
                                           elem_id="ctl-tau-prefetch")
            # Approximation only pays below ~0.1 (docs/benchmarks/speed-quality.md); a 0-1 scale in
            # steps of 0.05 left one useful stop.
            self.tau_approx = FreeSlider(**_slider("tau_approx"), value=d.tau_approx, label="τ_approx",
                                         info="approximate misses that matter less than this (0 = always exact; "
                                              "useful range 0–0.1)", elem_id="ctl-tau-approx")
            self.max_lookahead = FreeSlider(**_slider("max_lookahead"), value=d.max_lookahead,
                                            label="Max lookahead (layers)", elem_id="ctl-lookahead")
            with gr.Row():
                self.lore_rank = FreeDropdown(list(lore_ranks), value=d.lore_rank if d.lore_rank in lore_ranks
                                              else lore_ranks[-1], label="LoRE rank", min_width=100,
                                              elem_id="ctl-lore")
                self.cpu_lane = gr.Checkbox(value=d.cpu_lane, label="CPU lane", info="compute some misses on the CPU",
                                            min_width=100, elem_id="ctl-cpu")
        with gr.Accordion("Timing model and generation", open=False):
            self.profile = FreeDropdown(list(info.profiles), value=d.profile, label="Hardware profile",
                                        elem_id="ctl-profile")
            self.shape = FreeDropdown(shape_choices(info), value=d.shape, label="Model shape", info=shape_info(info),
                                      elem_id="ctl-shape")
            self.max_new_tokens = FreeSlider(1, limits.chat_max_new_tokens, value=d.max_new_tokens, step=1,
                                             label="Max new tokens", elem_id="ctl-max-new")
            self.temperature = FreeSlider(**_slider("temperature"), value=d.temperature, label="Temperature",
                                          info="0 = greedy", elem_id="ctl-temperature")
            self.live_panels = gr.Checkbox(value=True, label="Update the panels while a reply streams",
                                           elem_id="ctl-live")
            self.check_exact = gr.Checkbox(value=False, label="Measure greedy agreement with exact settings after "
                                           "each lossy reply (generates it once more)", elem_id="ctl-check")
        self.note = gr.Markdown(text.settings_hint(), elem_id="spice-settings-note", elem_classes=["spice-note"])

    @property
    def applied_on(self) -> list:
        """The events that apply a control's value: a slider's when it is let go or its box is left (or Enter,
        or an arrow key: `KEYS_JS`), never at each key typed into its box (a "1" on the way to "1.5" was
        applied); the others' when they change."""
        return [c.release if isinstance(c, gr.Slider) else c.change for c in self.values]

    @property
    def values(self) -> list:
        return [self.policy, self.cache_frac, self.tau_prefetch, self.tau_approx, self.max_lookahead,
                self.lore_rank, self.cpu_lane, self.profile, self.shape, self.max_new_tokens, self.temperature]

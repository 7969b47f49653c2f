"""The chat page's settings side bar: one control per RunSettings field the app exposes, and the note
under them. The sliders' ranges are the app's ranges (pages/common.SLIDER_RANGES)."""
from __future__ import annotations

import json

import gradio as gr

from spice_core.api import EngineInfo, RunSettings
from pages import chat_text as text
from pages.common import LORE_RANKS, SETTING_FIELDS, FreeDropdown, FreeSlider, policy_choices, shape_choices, shape_info
from pages.limits import Limits, slider_ranges


# Which settings field each slider's elem_id holds (the browser's requests name fields).
SLIDER_IDS = {"ctl-cache": "cache_frac", "ctl-tau-prefetch": "tau_prefetch", "ctl-tau-approx": "tau_approx",
              "ctl-lookahead": "max_lookahead", "ctl-max-new": "max_new_tokens", "ctl-temperature": "temperature"}

# A slider's value is requested when its number box is done with (Enter, or the box is left) or when the range
# is let go, moved with an arrow / Page / Home / End key, or reset (↺); never at a key typed into the box and
# never when the box is clicked into. Gradio's own `release` did not do: a click into the box sent one, and
# Gradio read the controls' values late enough to catch the key typed next ("1" on the way to "1.5" applied);
# leaving the box sent one and then clamped the box to the range's end, which the next event read and applied.
# So the browser reads the value itself, at that moment (a capture listener runs before Gradio's clamp), and
# writes every request so far, each with its sequence number, into one hidden box (#spice-setting-req). The
# server applies each field's requests once, in order (pages.chat.apply_requests); the chat's Send carries
# the same box, so a value finished by the click on Send applies to that message. Installed once per page.
SETTINGS_JS = """() => {
  if (window.spiceSettingsJs) return [];
  window.spiceSettingsJs = true;
  const IDS = %s;
  const RANGE_KEYS = ['ArrowLeft', 'ArrowRight', 'ArrowUp', 'ArrowDown', 'PageUp', 'PageDown', 'Home', 'End'];
  const requests = {};
  let seq = 0;
  const slider = (el) => {
    const holder = el && el.closest ? el.closest('[id^="ctl-"]') : null;
    return holder && IDS[holder.id] ? holder : null;
  };
  const send = (holder, raw) => {
    const field = IDS[holder.id];
    requests[field] = {v: raw, seq: ++seq};
    const box = document.querySelector('#spice-setting-req textarea, #spice-setting-req input');
    if (!box) return;
    const proto = Object.getPrototypeOf(box);
    Object.getOwnPropertyDescriptor(proto, 'value').set.call(box, JSON.stringify(requests));
    box.dispatchEvent(new Event('input', {bubbles: true}));
  };
  const number = (t) => t && t.matches && t.matches('#spice-controls input[type=number]') && slider(t);
  const range = (t) => t && t.matches && t.matches('#spice-controls input[type=range]') && slider(t);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && number(e.target)) send(slider(e.target), e.target.value);
  }, true);
  document.addEventListener('blur', (e) => { if (number(e.target)) send(slider(e.target), e.target.value); }, true);
  document.addEventListener('pointerup', (e) => {
    if (range(e.target)) { const t = e.target; setTimeout(() => send(slider(t), t.value), 0); }
  }, true);
  document.addEventListener('keyup', (e) => {
    if (RANGE_KEYS.includes(e.key) && range(e.target)) send(slider(e.target), e.target.value);
  }, true);
  document.addEventListener('click', (e) => {
    const reset = e.target && e.target.closest && e.target.closest('#spice-controls .reset-button');
    const holder = reset && slider(reset);
    if (holder) setTimeout(() => send(holder, holder.querySelector('input[type=number]').value), 0);
  }, true);
  return [];
}""" % (json.dumps(SLIDER_IDS),)


# The line under each slider's label (a typed value's note takes its place until the next one: pages.chat_settings).
SLIDER_INFO = {"cache_frac": "share of all routed experts that fit on the GPU",
               "tau_prefetch": "prefetch an expert when the draft is at least this confident",
               "tau_approx": "approximate misses that matter less than this (0 = always exact; useful range 0–0.1)",
               "max_lookahead": "", "max_new_tokens": "", "temperature": "0 = greedy"}


class ChatControls:
    """Built inside the side bar; ``values`` are the settings controls in SETTING_FIELDS order."""

    def __init__(self, info: EngineInfo, d: RunSettings, limits: Limits) -> None:
        lore_ranks = tuple(getattr(info, "lore_ranks", ()) or LORE_RANKS)
        ranges = slider_ranges(info, limits)        # GPU cache size from the smallest this model runs with

        def slider(name: str, **kw) -> FreeSlider:
            low, high, step = ranges[name]
            return FreeSlider(low, high, step=step, value=getattr(d, name), info=SLIDER_INFO[name] or None, **kw)

        with gr.Group():
            self.policy = FreeDropdown(policy_choices(info), value=d.policy, label="Policy",
                                       info="baselines, and SPICE with parts switched off", elem_id="ctl-policy")
            self.cache_frac = slider("cache_frac", label="GPU cache size", elem_id="ctl-cache")
            self.tau_prefetch = slider("tau_prefetch", label="τ_prefetch", elem_id="ctl-tau-prefetch")
            # Approximation only pays below ~0.1 (docs/benchmarks/speed-quality.md); a 0-1 scale in
            # steps of 0.05 left one useful stop.
            self.tau_approx = slider("tau_approx", label="τ_approx", elem_id="ctl-tau-approx")
            self.max_lookahead = slider("max_lookahead", label="Max lookahead (layers)", elem_id="ctl-lookahead")
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
            self.max_new_tokens = slider("max_new_tokens", label="Max new tokens", elem_id="ctl-max-new")
            self.temperature = slider("temperature", label="Temperature", elem_id="ctl-temperature")
            self.live_panels = gr.Checkbox(value=True, label="Update the panels while a reply streams",
                                           elem_id="ctl-live")
            self.check_exact = gr.Checkbox(value=False, label="Measure greedy agreement with exact settings after "
                                           "each lossy reply (generates it once more)", elem_id="ctl-check")
        self.note = gr.Markdown(text.settings_hint(), elem_id="spice-settings-note", elem_classes=["spice-note"])
        # The browser's slider requests (SETTINGS_JS writes them; never typed into).
        self.requests = gr.Textbox("", visible="hidden", elem_id="spice-setting-req", show_label=False,
                                   container=False)

    @property
    def infos(self) -> dict:
        """field -> the line under its slider's label when no note takes its place ("" for none)."""
        return dict(SLIDER_INFO)

    @property
    def sliders(self) -> dict:
        """field -> slider, for the ones whose values the browser requests (SETTINGS_JS)."""
        by_id = {c.elem_id: c for c in self.values}
        return {field: by_id[elem_id] for elem_id, field in SLIDER_IDS.items()}

    @property
    def others(self) -> dict:
        """field -> control, for the ones that apply when they change (menus and checkboxes)."""
        sliders = set(self.sliders)
        return {f: c for f, c in zip(SETTING_FIELDS, self.values) if f not in sliders}

    @property
    def values(self) -> list:
        return [self.policy, self.cache_frac, self.tau_prefetch, self.tau_approx, self.max_lookahead,
                self.lore_rank, self.cpu_lane, self.profile, self.shape, self.max_new_tokens, self.temperature]

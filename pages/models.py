"""More than one model in one app: a chat and a sweep page per model, a picker between them, and one
run registry over all of them for the trace explorer and the exports.

    engines ─► ModelPage per engine: "/" and "/sweep" for the first (the default), hidden routes
               "/<name>" and "/sweep-<name>" for the others, each page built on its own AppContext
               (its engine and info) sharing the runner, the run book, the sweeps and the exports
            ─► EngineSet: list_runs / get_summary / get_events / baselines / export_* of whichever engine
               holds the run (run ids are unique across engines), for the trace explorer and About
    picker  ─► a dropdown atop the chat and sweep pages, shown only with more than one model: picking
               opens that model's page (a page is built for one model: its controls, panels and
               limits come from that model's info)

Why pages per model rather than one page that swaps its engine: every visitor shares the engines, so a
switch must be per visitor, and a page's components (layers in the panels, LoRE ranks, context length)
are sized from one model's info when the page is built. Knows the engine only through `spice_core.api`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from spice_core.api import EngineInfo, EngineLike, RunSettings, RunSummary, own_shape
from spice_core.errors import SpiceError


@dataclass(frozen=True)
class ModelPage:
    """Where one model's pages live and how the picker names it."""

    info: EngineInfo
    chat_path: str          # "" for the default model's main page, else its name
    sweep_path: str         # "sweep", or "sweep-<name>"
    key: str                # "" for the default model, "_<name>" otherwise: API names and browser storage

    @property
    def name(self) -> str:
        return self.info.model_name

    @property
    def label(self) -> str:
        shape = own_shape(self.info)
        return f"{self.name} · {shape} routing" if shape else self.name


def model_pages(infos: list[EngineInfo]) -> tuple[ModelPage, ...]:
    """One ModelPage per engine, the first at the app's own paths; names must differ (they are paths)."""
    names = [i.model_name for i in infos]
    if len(set(names)) != len(names):
        raise SpiceError(f"two models share a name ({', '.join(names)}): the app tells models apart by folder name")
    out = []
    for n, info in enumerate(infos):
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", info.model_name).strip("-") or f"model{n}"
        out.append(ModelPage(info, "" if n == 0 else slug, "sweep" if n == 0 else f"sweep-{slug}",
                             "" if n == 0 else "_" + slug.replace("-", "_")))
    return tuple(out)


def picker(pages: tuple[ModelPage, ...], current: str, page: str) -> gr.Dropdown | None:
    """The model picker atop a chat (``page`` "chat") or sweep page: opens the picked model's same page.
    None (nothing drawn) with a single model."""
    if len(pages) < 2:
        return None
    paths = {p.name: "./" + (p.chat_path if page == "chat" else p.sweep_path) for p in pages}
    box = gr.Dropdown([(p.label, p.name) for p in pages], value=current, label="Model", elem_id=f"{page}-model",
                      info="each model has its own page: picking one opens it")
    go = f"(m) => {{ const to = {json.dumps(paths)}[m]; if (to) window.location.assign(to); return []; }}"
    box.change(None, inputs=[box], js=go, queue=False, api_visibility="private", show_progress="hidden")
    return box


class EngineSet:
    """The run registry of several engines as one `EngineLike` (what the trace explorer and the exports read).
    Generation goes to one engine through its own page; here ``start_*`` and ``info`` are the first's."""

    def __init__(self, engines: list[EngineLike]) -> None:
        self.engines = list(engines)

    def info(self) -> EngineInfo:
        return self.engines[0].info()

    def infos(self) -> list[EngineInfo]:
        return [e.info() for e in self.engines]

    def start_chat(self, messages: list[dict], settings: RunSettings):
        return self.engines[0].start_chat(messages, settings)

    def start_prompt(self, prompt: str, settings: RunSettings):
        return self.engines[0].start_prompt(prompt, settings)

    def list_runs(self) -> list[RunSummary]:
        return [s for e in self.engines for s in e.list_runs()]

    def _holder(self, run_id: str) -> EngineLike:
        for e in self.engines:
            if any(s.run_id == run_id for s in e.list_runs()):
                return e
        return self.engines[0]           # it raises the engine's own "unknown or expired" error

    def get_summary(self, run_id: str) -> RunSummary:
        return self._holder(run_id).get_summary(run_id)

    def get_events(self, run_id: str) -> list:
        return self._holder(run_id).get_events(run_id)

    def baselines(self, run_id: str) -> dict:
        return self._holder(run_id).baselines(run_id)

    def export_chrome_trace(self, run_id: str, out_dir: Path) -> Path:
        return self._holder(run_id).export_chrome_trace(run_id, out_dir)

    def export_chrome_trace_gz(self, run_id: str, out_dir: Path) -> Path:
        return self._holder(run_id).export_chrome_trace_gz(run_id, out_dir)

    def export_tensorboard_zip(self, run_id: str, out_dir: Path) -> Path:
        return self._holder(run_id).export_tensorboard_zip(run_id, out_dir)

    def export_csv(self, run_id: str, out_dir: Path) -> Path:
        return self._holder(run_id).export_csv(run_id, out_dir)

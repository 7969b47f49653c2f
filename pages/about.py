"""About page: what SPICE does, how to read the panels, the engine in use, the measured headline and the other
benchmark files.

The benchmark table is read from the Markdown files under ``docs/benchmarks/`` each time the page
opens (so a new benchmark shows without a restart): the newest file by the latest ISO date it
mentions, else by its last commit when the app runs from a git checkout (`git_dates`: local history, no network),
else undated and listed last (a file's modification time says when it was checked out or copied, not when it was
written, so it is never shown); ties go to the later commit. It shows
its first table (or the first after a ``<!-- about: table -->`` line, for a file whose newest results
come after older ones) and the heading above it, with the file's path as the source. A row whose setting names
a LoRE rank (``r=16``) that the file's model does not ship is left out, with a note: a benchmark may fit LoRE
factors of its own, and the page must not offer rows the visitor's model cannot run (`rows_for_lore_ranks`).
"""
from __future__ import annotations

import json
import logging
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from spice_core.api import EngineInfo, format_bytes, own_shape
from pages.common import AppContext

log = logging.getLogger(__name__)

HEADLINE_RESULTS = Path("headline/results.json")     # under the benchmarks folder
HEADLINE_BUDGET = 0.25
HEADLINE_POLICIES = ("on_demand", "lru", "spice_prefetch", "spice", "oracle_prefetch", "resident")
DATE = re.compile(r"\b(20\d\d-[01]\d-[0-3]\d)\b")
ABOUT_MARKER = "<!-- about: table -->"      # in a benchmark file: the table About shows is the first below
SEPARATOR = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")   # a table's |---|:--:| row
LORE_RANK = re.compile(r"\br=(\d+)\b")       # a benchmark setting's LoRE rank: "spice τ=0.05 r=16"
GIT_TIMEOUT_S = 10.0

ABOUT = """
## What SPICE does
A Mixture-of-Experts model runs only a few experts per token, but all of them must be reachable. When they
do not fit in GPU memory they live in host memory, and at batch size 1 decoding time is dominated by copying
the experts each token routes to across PCIe. SPICE attacks that in three ways:

1. **Speculate.** A small *draft* predicts which experts the next layers will need, with a confidence; an
   *adaptive lookahead* prefetches the confident ones early enough that the copies hide behind compute
   (**τ_prefetch** is the confidence needed; **max lookahead** bounds how far ahead).
2. **Approximate** cheap misses. When a needed expert is not on the GPU and matters little for this token,
   use the resident shared expert plus a **low-rank expert surrogate (LoRE)** instead (**τ_approx**; 0 keeps
   every token exact).
3. **Orchestrate** exact misses: compute the expert on the **CPU lane** from host memory while the GPU works on
   the hits, or copy it in, whichever the measured costs say finishes first.

## Reading the main page
- **Experts per layer**: one cell per (layer, expert). Left, the latest token; right, each expert's most frequent
  outcome so far, paler the fewer tokens used it (solid: as often as the most-used expert; hover for counts).
  Green = already on the GPU, blue = there because a prefetch brought it, purple = approximated, orange = computed
  on the CPU, red = copied on demand (the layer waited), yellow = prefetched but late (the layer waited too).
- **Prefetch timeline**: every recent prefetch as its copy (issued → arrived) on the row of the layer that needs
  it, with a tick where that layer needed it: blue arrived in time, red late, grey not used. Below, the lookahead
  depth and the hit rate per token.
- **Lanes**: what the GPU, the copy stream and the CPU workers were doing during the last tokens. Red-pink gaps on
  the GPU row are stalls: time spent waiting for an expert.

## Timing: measured or modeled
On a CUDA machine the times are **measured** with CUDA events. Anywhere else the small model still generates the
tokens for real, but the times are **modeled**: the engine replays what it did (which experts hit, were copied,
prefetched, computed on the CPU) on a named **hardware profile** as if the experts had a real model's **shape**
(for example DeepSeek-V2-Lite on an RTX 4090 over PCIe 4.0 x16). Every number says which mode produced it.
Each shipped model is a miniature of one real model (spice-mini of DeepSeek-V2-Lite, spice-mini-qwen2 of
Qwen2-57B-A14B): its own shape times that real model's layout; another shape only resizes its routing.

## Quality
On the CPU every policy except approximation gives the same greedy tokens as the stock model. On a GPU the fast
path's exact policies give `resident`'s tokens bit for bit, except where a miss runs on the CPU lane: the lane sums
an expert's products in another order than the GPU's kernel, so a near-tie can flip a token (`cpu_compute`'s
greedy agreement with `resident` is measured in `docs/benchmarks/headline/`), and the main page measures such
replies instead of claiming them identical. `resident` itself sums in another order than stock transformers' loop on the GPU. Lossy settings are reported as
speed–quality pairs: the main page can measure greedy agreement with exact settings after each reply, and the
*Sweep* page plots agreement against time per token for a grid of thresholds. **Greedy agreement** is one number
everywhere (chat, sweep, benchmarks): the share of positions where a reply has the exact run's token, over the
longer of the two.

## Sources
- The method: *SPICE*, arXiv:2608.21240 ([abstract](https://arxiv.org/abs/2608.21240)).
- The models: each shipped miniature's model card is the `README.md` in its folder under `assets/`
  (`assets/spice-mini`, `assets/spice-mini-qwen2`): how it was trained, its held-out numbers and its limits.
- The engine, the app and the benchmarks: this project's `README.md` and `docs/benchmarks/`.
"""


@dataclass(frozen=True)
class BenchmarkTable:
    path: Path
    heading: str
    table: str
    date: str               # ISO date, "" when neither the text nor git history dates the file
    commit_time_s: int = 0  # the file's last commit (Unix seconds), 0 if none: orders files of one date


@dataclass(frozen=True)
class GitDate:
    date: str               # the committer's date, ISO
    time_s: int


def git_dates(folder: Path) -> dict[Path, GitDate]:
    """Each file under ``folder``'s last commit, from one `git log` of the folder's own checkout; {} when it is
    none (no git, not a checkout, git refuses it). In a shallow clone a file whose last commit is the clone's
    cut-off is left out: that commit only says when the clone was made."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True,
                              timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL).stdout

    try:
        shallow = git("rev-parse", "--is-shallow-repository").strip() == "true"
        out = git("log", "--format=%x00%ct %cs %P", "--name-only", "--relative", "--no-renames", "--", ".")
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("no git dates for %s: %s", folder, exc)
        return {}
    dates: dict[Path, GitDate] = {}
    for entry in out.split("\0")[1:]:               # newest commit first: a file's first entry is its last commit
        head, *names = entry.strip("\n").split("\n")
        time_s, date, *parents = head.split()
        if shallow and not parents:                   # the cut-off of a shallow clone (or its true root)
            continue
        for name in filter(None, names):
            dates.setdefault(Path(folder) / name, GitDate(date, int(time_s)))
    return dates


def first_table(text: str) -> tuple[str, str]:
    """(heading, table) of the first Markdown table in ``text``, or of the first after an ABOUT_MARKER line
    when there is one; ("", "") if none. The heading is the nearest one above the table, after the top-level
    heading it sits under when that is another ("Round 3 — Results")."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == ABOUT_MARKER), 0)
    top = heading = ""
    in_code = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if in_code:
            continue            # a shell comment in a code block is not a heading
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            if line.startswith("# "):
                top = heading
        is_sep = i + 1 < len(lines) and SEPARATOR.match(lines[i + 1])
        if i >= start and line.strip().startswith("|") and is_sep:
            j = i
            while j < len(lines) and lines[j].strip().startswith("|"):
                j += 1
            return (f"{top} — {heading}" if top and top != heading else heading), "\n".join(lines[i:j])
    return "", ""


def rows_for_lore_ranks(table: str, ranks: tuple[int, ...]) -> tuple[str, list[int], list[int]]:
    """(the table without the rows whose setting, the first cell, names a LoRE rank not in ``ranks``; the ranks
    of the rows left out; ranks not in ``ranks`` that other cells of the rows kept still name), sorted."""
    kept, dropped, named = [], set(), set()
    for n, line in enumerate(table.splitlines()):
        cells = line.strip().strip("|").split("|")
        if n >= 2:          # the header and its |---| row always stay
            row_ranks = {int(r) for r in LORE_RANK.findall(cells[0])} - set(ranks)
            if row_ranks:
                dropped |= row_ranks
                continue
            named |= {int(r) for c in cells[1:] for r in LORE_RANK.findall(c)} - set(ranks)
        kept.append(line)
    return "\n".join(kept), sorted(dropped), sorted(named)


def model_named(text: str, infos: list[EngineInfo]) -> EngineInfo:
    """The served model a benchmark file is about: the longest of their names it mentions (spice-mini-qwen2
    before spice-mini), else the default (first) model."""
    named = [i for i in infos if re.search(rf"\b{re.escape(i.model_name)}\b(?!-)", text)]
    return max(named, key=lambda i: len(i.model_name)) if named else infos[0]


def lore_rank_note(model: EngineInfo, dropped: list[int], named: list[int]) -> str:
    """What `rows_for_lore_ranks` left out, and why, for the table's model."""
    if not dropped and not named:
        return ""
    words = lambda ranks: ", ".join(str(r) for r in ranks)     # noqa: E731
    has = f"ships LoRE factors of ranks {words(model.lore_ranks)}" if model.lore_ranks else "ships no LoRE factors"
    parts = []
    if dropped:
        parts.append(f"Rows at LoRE rank {words(dropped)} are left out")
    if named:
        parts.append(f"{'its' if dropped else 'This table’s'} settings at rank {words(named)} used LoRE factors the "
                     "benchmark fitted itself")
    return f"{'; '.join(parts)}: `{model.model_name}` {has}{' (the file has every row)' if dropped else ''}."


def benchmark_tables(folder: Path) -> list[BenchmarkTable]:
    """Every benchmark file with a table, newest first (the module docstring says how a file is dated); undated
    files last, by path."""
    out = []
    committed = None
    for path in sorted(Path(folder).rglob("*.md")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):      # one unreadable or non-UTF-8 file: left out, not the whole list
            log.warning("about: left out %s (not readable as UTF-8 text)", path)
            continue
        heading, table = first_table(text)
        if not table:
            continue
        if committed is None:
            committed = git_dates(Path(folder))
        git = committed.get(path)
        dates = DATE.findall(text)
        out.append(BenchmarkTable(path, heading, table, max(dates) if dates else git.date if git else "",
                                  git.time_s if git else 0))
    dated = sorted((b for b in out if b.date), key=lambda b: (b.date, b.commit_time_s, b.path.as_posix()),
                   reverse=True)
    return dated + [b for b in out if not b.date]


# The headline's models: what each lifted miniature stands for, and its routed experts in host memory.
HEADLINE_MODELS = {"lift:spice-mini": ("DeepSeek-V2-Lite", "28.8 GB"), "lift:spice-mini-qwen2": ("Qwen2-57B-A14B", "98.7 GB")}


def headline_markdown(results: Path) -> str:
    """The measured headline: the headline run's records at 25% (held-out prompts x 64 tokens), one table per
    model, read from its results.json each time (the only numbers the page quotes as the headline)."""
    try:
        records = json.loads(Path(results).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"No measured headline yet (`{HEADLINE_RESULTS.as_posix()}` under docs/benchmarks)."
    by_model: dict = {}
    for r in records:
        if (isinstance(r, dict) and not r.get("peer") and r.get("workload", "prompts") == "prompts"
                and r.get("timing") == "measured" and r.get("budget_frac") == HEADLINE_BUDGET and r.get("tpot_ms_median")):
            by_model.setdefault(r.get("model"), {})[(r.get("link"), r.get("policy"))] = r
    order = [m for m in HEADLINE_MODELS if m in by_model] + [m for m in by_model if m not in HEADLINE_MODELS]
    parts = [_headline_table(m, by_model[m]) for m in order]
    parts = [t for t in parts if t]
    if not parts:
        return "The headline results hold no measured 25% record yet."
    return ("\n\n".join(parts) + f"\n\nSource: `docs/benchmarks/{HEADLINE_RESULTS.as_posix()}` (every policy, budget, "
            "link and model, the targets met and missed, and what is still to run, in the README beside it).")


def _headline_table(model, rows: dict) -> str:
    """One model's 25% table, or "" where it has no measured `spice` row."""
    links = [link for link in ("native", "pcie4x8") if (link, "spice") in rows]
    if not links:
        return ""
    names = {"native": "PCIe 5.0 x16 (native)", "pcie4x8": "PCIe 4.0 x8 (emulated)"}
    head = ("| link | GPU | " + " | ".join(f"`{p}`" for p in HEADLINE_POLICIES)
            + " | spice vs on_demand | spice vs lru | decode steps |")
    lines = [head, "|---" * (len(HEADLINE_POLICIES) + 5) + "|"]
    gpus = {link: _row_gpu(rows[(link, "spice")]) for link in links}
    step_counts = set()
    for link in links:
        cells = [f"{rows[(link, p)]['tpot_ms_median']:.1f} ms" if (link, p) in rows else "–" for p in HEADLINE_POLICIES]
        sp = rows[(link, "spice")]["tpot_ms_median"]
        ratio = lambda p: f"{rows[(link, p)]['tpot_ms_median'] / sp:.2f}×" if (link, p) in rows else "–"  # noqa: E731
        steps = min(r["n_decode_tokens"] for (lk, _), r in rows.items() if lk == link and "n_decode_tokens" in r)
        lines.append(f"| {names.get(link, link)} | {gpus[link]} | " + " | ".join(cells)
                     + f" | {ratio('on_demand')} | {ratio('lru')} | {steps} |")
        step_counts.add(steps)
    quality = headline_quality(rows[(links[0], "spice")], links[0])
    real, slab = HEADLINE_MODELS.get(model, (None, None))
    what = (f"the shipped miniature lifted to {real}'s shapes ({slab} of routed experts in host memory)" if real
            else f"`{model or 'the model'}`")
    where = f"one {gpus[links[0]]}" if len(set(gpus.values())) == 1 else "one GPU per link (the GPU column)"
    return (f"TPOT median, **measured** on {where}: {what}, 25% GPU budget, held-out prompts × 64 tokens, "
            f"the CUDA-graph fast path with its CPU lane where the lane pays (the x8 link).{quality}\n\n" + "\n".join(lines)
            + ("\n\nA link with fewer decode steps has run on fewer of the prompts so far (what is still to run is "
               "listed in the README beside the results)." if len(step_counts) > 1 else ""))


def _row_gpu(record: dict) -> str:
    """The GPU a headline record ran on; records from before the report named it ran on an H200."""
    return str(record.get("gpu") or "H200")


def headline_quality(record: dict, link: str) -> str:
    """Quality of the headline's `spice` row, at a glance: its perplexity change and its greedy agreement (the
    project's one definition: positions with the same token as `resident`, over the prompt set)."""
    parts = []
    if record.get("ppl_delta_pct") is not None:
        parts.append(f"perplexity {record['ppl_delta_pct']:+.2f}% on held-out text (the miniature on the CPU, same setting)")
    if record.get("tf_ppl_delta_pct") is not None:
        parts.append(f"perplexity {record['tf_ppl_delta_pct']:+.2f}% on the GPU (fed `resident`'s tokens)")
    if record.get("greedy_agreement") is not None:
        parts.append(f"greedy agreement with `resident` {100 * record['greedy_agreement']:.0f}% "
                     "(positions with the same token)")
    if not parts:
        return ""
    return f" Quality of `spice` (LoRE τ_approx 0.05, rank 4) on the {link} link: **{'**, **'.join(parts)}**."


class AboutPage:
    def __init__(self, ctx: AppContext, benchmarks_dir: Path, repo_root: Path) -> None:
        self.ctx = ctx
        self.dir = Path(benchmarks_dir)
        self.root = Path(repo_root)

    def build(self) -> None:
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                gr.Markdown(ABOUT)
            with gr.Column(scale=2):
                gr.Markdown("## This engine\n" + self._engine_table())
                gr.Markdown("## Whose routing each shape times\n" + routing_text(self._infos()),
                            elem_id="about-routing")
        gr.Markdown("## Measured headline")
        self.headline = gr.Markdown("", elem_id="about-headline")
        gr.Markdown("## Other benchmark files\nOne experiment or A/B a file, each on the machine and engine of its day "
                    "(newest first): its numbers compare with its own rows only. The measured headline above is the "
                    "comparison this project quotes.")
        self.pick = gr.Dropdown(choices=[], value=None, label="Benchmark file", elem_id="about-bench-pick",
                                info="newest first")
        self.bench = gr.Markdown("", elem_id="about-bench")
        gr.on(None, self.on_load, outputs=[self.pick, self.bench], queue=False, api_name="benchmarks")
        gr.on(None, lambda: headline_markdown(self.dir / HEADLINE_RESULTS), outputs=[self.headline], queue=False,
              api_name="headline")
        # The visitor's pick alone (the load shows the newest file itself): a change listener would also run at the
        # load, whose progress is silent (pages.common.quiet_page_loads), and so show none for a pick either.
        self.pick.input(self.show, inputs=[self.pick], outputs=[self.bench], queue=False, api_visibility="private")

    def _infos(self) -> list[EngineInfo]:
        return [p.info for p in self.ctx.models] or [self.ctx.info]

    def _engine_table(self) -> str:
        """One column per model the app serves."""
        infos = self._infos()
        rows = [("model", lambda i: f"`{i.model_name}` ({i.family})"),
                ("layers", lambda i: f"{i.n_layers}, MoE: {len(i.moe_layers)}"),
                ("experts", lambda i: f"{i.n_experts} routed per layer, top-{i.top_k}"),
                ("expert size", lambda i: format_bytes(i.expert_bytes)), ("device", lambda i: i.device),
                ("timing", lambda i: i.default_timing),
                ("draft heads", lambda i: "yes" if i.has_draft else "no (gate predictor)"),
                ("LoRE factors", lambda i: f"ranks {', '.join(map(str, i.lore_ranks))}" if i.has_lore and i.lore_ranks
                 else "yes" if i.has_lore else "no"),
                ("context", lambda i: f"{i.max_context_tokens:,} tokens"),
                ("hardware profiles", lambda i: ", ".join(i.profiles)), ("shapes", lambda i: ", ".join(i.shapes))]
        head = "| property | " + " | ".join("value" if len(infos) == 1 else i.model_name for i in infos) + " |"
        body = "\n".join(f"| {name} | " + " | ".join(cell(i) for i in infos) + " |" for name, cell in rows)
        return f"{head}\n|---|{'---|' * len(infos)}\n{body}"

    def _rel(self, path: Path) -> str:
        try:
            return path.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return path.name

    def on_load(self):
        tables = benchmark_tables(self.dir)
        if not tables:
            return gr.update(choices=[], value=None, visible=False), "No benchmark results yet (`docs/benchmarks/*.md`)."
        choices = [(f"{self._rel(b.path)}{_dated(b)}", self._rel(b.path)) for b in tables]
        return gr.update(choices=choices, value=choices[0][1], visible=True), self._render(tables[0])

    def show(self, rel):
        for b in benchmark_tables(self.dir):
            if self._rel(b.path) == rel:
                return self._render(b)
        return gr.skip()

    def _render(self, b: BenchmarkTable) -> str:
        heading = f"**{b.heading}**\n\n" if b.heading else ""
        try:
            model = model_named(b.path.read_text(encoding="utf-8"), self._infos())
        except (OSError, UnicodeDecodeError):
            model = self._infos()[0]
        table, dropped, named = rows_for_lore_ranks(b.table, tuple(model.lore_ranks))
        note = lore_rank_note(model, dropped, named)
        return f"{heading}{table}\n\n{note + chr(10) * 2 if note else ''}Source: `{self._rel(b.path)}`{_dated(b)}"


def _dated(b: BenchmarkTable) -> str:
    """" (2025-03-04)" after a file's name, nothing for an undated file."""
    return f" ({b.date})" if b.date else ""


def routing_text(infos: list[EngineInfo]) -> str:
    """Which model's routing the modeled times of each shape replay: a shape is a real model's sizes; the
    experts each token uses always come from the model that generates. A miniature's own shape (the real
    model whose topology it has) thus stands for that real model; another shape resizes its routing only."""
    shapes = [s for s in infos[0].shapes if s != "native"]
    rows = []
    for shape in shapes:
        own = [i.model_name for i in infos if own_shape(i) == shape]
        other = [i.model_name for i in infos if own_shape(i) != shape]
        cells = ([f"**{', '.join(own)}**: its own routing, so times stand for {shape}"] if own else []) + \
                ([f"{', '.join(other)}: {shape}'s sizes on that model's routing (\"sizes only\" in the menu)"]
                 if other else [])
        rows.append(f"| {shape} | {'; '.join(cells)} |")
    rows.append("| native | the chosen model's own sizes and routing |")
    return ("Modeled times replay the experts the chatting model routed to, at a shape's sizes. A shape "
            "matches one model's topology (layers, experts, top-k); on another model it keeps that "
            "model's routing.\n\n| shape | times come from |\n|---|---|\n" + "\n".join(rows))


def build(ctx: AppContext, benchmarks_dir: Path, repo_root: Path) -> AboutPage:
    """Create the About page's components in the caller's context."""
    page = AboutPage(ctx, benchmarks_dir, repo_root)
    page.build()
    return page

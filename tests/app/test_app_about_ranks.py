"""About shows benchmark rows only at LoRE ranks the model ships (issue 24, defect 11). Regression: its
benchmark table listed rows at rank 16 (factors the speed-quality benchmark fitted itself) for spice-mini,
whose shipped LoRE factors are rank 4 (ranks 1, 2, 4 in the chat's menu)."""
import pytest

from app_helpers import ROOT, SHIPPED
from pages.about import LORE_RANK, AboutPage, benchmark_tables

RESULTS = ROOT / "docs" / "benchmarks" / "speed-quality.results.md"


def test_about_leaves_out_rows_at_lore_ranks_the_shipped_model_does_not_have():
    if not (SHIPPED / "config.json").exists():
        pytest.skip("needs the shipped model")
    from pages.common import AppContext
    from spice_core.engine import SpiceEngine

    ctx = AppContext.create(SpiceEngine.load(None, device="cpu"))
    try:
        ranks = ctx.info.lore_ranks
        assert ranks and 16 not in ranks, "the shipped LoRE must lack rank 16 for this check to mean something"
        page = AboutPage(ctx, ROOT / "docs" / "benchmarks", ROOT)
        table = next(b for b in benchmark_tables(page.dir) if b.path == RESULTS)
        assert "r=16 |" in table.table                      # the file has them ...
        shown = page._render(table)
        rows = [line.split("|")[1] for line in shown.splitlines() if line.startswith("| spice τ=")]
        assert rows and {int(r) for row in rows for r in LORE_RANK.findall(row)} <= set(ranks), rows  # ... About not
        assert "Rows at LoRE rank 16 are left out" in shown and ", ".join(map(str, ranks)) in shown
        assert f"ranks {', '.join(map(str, ranks))}" in page._engine_table()
    finally:
        ctx.exports.cleanup()

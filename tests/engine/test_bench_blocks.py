"""The order bench runs its "runs" blocks in: one after the other, or interleaved per prompt (`block_units`)."""
from spice_core.tools.bench_blocks import block_units, resolve_blocks

WORKLOADS = [("prompts", 0, [1]), ("prompts", 1, [2]), ("long", 2, [3])]


def _blocks(*runs):
    return resolve_blocks({"runs": list(runs)}, ["lru"], [0.25], ["native"], WORKLOADS, 2, 4, 1, (0, 1))


def test_blocks_run_one_after_the_other_unless_interleaved():
    blocks = _blocks({"variant": "a"}, {"variant": "b", "long_prompt": False})
    seq = [(i, w[1]) for i, _, _, _, w in block_units(blocks, False)]
    assert seq == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    inter = [(i, w[1]) for i, _, _, _, w in block_units(blocks, True)]
    assert inter == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]


def test_interleaving_keeps_the_config_order_of_links_and_budgets():
    blocks = _blocks({"links": ["pcie4x8", "native"], "budgets": [0.5, 0.1], "long_prompt": False},
                     {"links": ["pcie4x8", "native"], "budgets": [0.5, 0.1], "long_prompt": False})
    units = block_units(blocks, True)
    assert [(u[1], u[3]) for u in units[:4]] == [("pcie4x8", 0.5)] * 4
    assert [u[0] for u in units[:4]] == [0, 1, 0, 1] and units[-1][1:4] == ("native", 0, 0.1)
    assert len(units) == len(block_units(blocks, False)) == 16

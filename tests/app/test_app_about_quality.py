"""About's one-line quality of the headline's `spice` row names where each perplexity figure was measured: the
CPU replay of the miniature and the GPU's teacher-forced pass differ (+0.20% and −0.06% for the native row), and a
bare "held-out perplexity" let the About page and the README quote different numbers for the same row."""
from pages.about import headline_quality


def test_both_perplexity_figures_are_shown_each_with_where_it_was_measured():
    line = headline_quality({"ppl_delta_pct": 0.2028, "tf_ppl_delta_pct": -0.0576, "greedy_agreement": 0.77}, "native")
    assert "+0.20% on held-out text (the miniature on the CPU" in line
    assert "-0.06% on the GPU" in line
    assert "greedy agreement with `resident` 77%" in line


def test_a_row_without_a_gpu_pass_shows_only_the_cpu_figure_and_an_empty_row_nothing():
    line = headline_quality({"ppl_delta_pct": 0.2837}, "pcie4x8")
    assert "+0.28% on held-out text" in line and "on the GPU" not in line
    assert headline_quality({}, "native") == ""

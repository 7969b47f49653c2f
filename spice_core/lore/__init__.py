"""LoRE: low-rank expert surrogates that stand in for a missed expert (SPICE part 2).

`bank.LoreBank` holds and applies them (and reads / writes their safetensors file);
`fit.fit_lore_bank` fits them on calibration activations; `fit.lore_error_report` measures
them per rank against plain SVD of the weights.
"""
from spice_core.lore.bank import LoreBank, load_lore_bank, save_lore_bank
from spice_core.lore.fit import fit_lore_bank, lore_error_report

__all__ = ["LoreBank", "fit_lore_bank", "load_lore_bank", "lore_error_report", "save_lore_bank"]

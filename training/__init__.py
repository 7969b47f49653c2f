"""Everything that makes the shipped miniatures, ``assets/spice-mini`` (the default) and ``assets/spice-mini-qwen2``.

    stories (generator) ─┐
    sources (Austen, WEB, Shakespeare) ─► corpus ─► tokenizer ─► data (packed rows) ─► train ─► export
                                                                                        │
                               stats (routing) + evaluate (val loss, samples) ─► model_card (+ card_families)

This package deliberately knows nothing of the engine (``spice_core``) except its error
types and its argument checks (``spice_core.tools.args``): the engine loads the result like any
other checkpoint.
"""

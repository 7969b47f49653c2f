"""The command-line tools (`python -m spice_core <command>`), built on the engine; the engine imports none of them.

    cli.py            the dispatcher: one subcommand per module below, one-line errors, exit 2
    args.py           argument types that refuse bad values as they are parsed
    generate.py       generate: one prompt through the engine, text and stats (--json), traces
    calibrate.py      calibrate: draft heads and LoRE factors beside a model
    quality.py        quality: perplexity delta, KL and greedy agreement of lossy settings
    bench*.py         bench: policies compared in one run (config, models, records)
    lift.py           lift: the shipped miniature at a real model's tensor shapes
    calibrate_hw.py   calibrate-hw: this machine's hardware profile (CUDA)
    recalibrate.py    recalibrate: the host's costs fitted from measured traces
"""

"""Execution mechanisms: the experts module that replaces transformers', expert math,
and the CPU lane. They act on a plan; they never decide."""

"""Trace events: one schema for measured and modeled timing, and their exports."""
from spice_core.trace.events import EVENT_KINDS, LANES_FIXED, OUTCOMES, TraceEvent

__all__ = ["EVENT_KINDS", "LANES_FIXED", "OUTCOMES", "TraceEvent"]

"""The mechanism of a run: executors that carry out the planner's decisions on a device.

    layer.py          LayerRuntime: predictor -> planner (policy/planner.py) -> executor -> recorder, per MoE layer
    eager.py          EagerExecutor: PyTorch calls, one expert at a time (CPU and CUDA; per-expert trace detail)
    graph_exec.py     GraphExecutor: the fast path; prefill eager, decode steps as CUDA-graph segments
    copies.py         CopyEngine: slots, the copy stream, link pacing, per-slot ready/free events (both executors)
    cpu_jobs.py       CpuJobs: the planner's CPU misses on the CPU lane, collected or fallen back (both executors)
    graphed.py        GraphedDecoder: captures and replays one segment per MoE layer, cut at the experts call
    graphed_static.py StaticStep: the one-graph step of a cache that never changes, run ahead when greedy
    graphed_plan.py   plan rows the segments read (pure): named rows, a kind per selection
    graphed_slots.py  reference slot callbacks (all resident; the planner's LRU) the decoder is measured with standalone
    slots.py          SlotBuffer: the GPU expert cache's memory
    context.py        PredictContext: the narrow view predictors get of a run

Nothing here decides anything: which expert goes where, and when, is the planner's.
"""

"""Recalibrate a hardware profile's host costs from measured traces.

    python -m spice_core recalibrate --profile hw.json --trace lru.json.gz \
        [--prefetch-trace spice.json.gz] --out hw-recalibrated.json

`calibrate-hw` measures the devices one operation at a time (copy bandwidth, one expert on
the GPU and on the CPU). A measured decode at batch 1 is slower than those pieces add up to,
because the host is a lane of its own: each MoE layer reads its routing back, so the Python
that launches kernels, plans and issues copies is not hidden behind the GPU. This fits the
profile's host fields (profiles.py) from the engine's own measured Chrome traces:

- ``host_layer_us``: median span of a MoE layer's non-expert work (from the previous layer's
  last expert to the routing readback), in a trace without prefetching;
- ``host_copy_us``: slope of the gap between the routing readback and the first expert over
  the number of demand copies issued in between (least squares; the intercept, the per-layer
  miss bookkeeping, is added to ``host_layer_us``);
- ``host_expert_us``: median interval between consecutive expert launches of one layer when
  no stall sits between them;
- ``host_plan_us`` (with a prefetching trace): how much longer its median MoE layer is, minus
  the issue cost of the prefetch copies made per layer;
- ``host_step_us``: the median time per token outside the layers (sampling, the readback of
  the token, Python between tokens);
- ``cpu_mem_gbps`` and ``cpu_job_compute_us`` (``--lane-records``): the CPU lane's rate and fixed compute per job,
  from measured `cpu_compute` records of two expert sizes (`lane_fit.py`), and ``cpu_side_speedup`` where the
  records' lane ran layers both one after another and side by side;
- ``cpu_task_us`` (when the traces hold CPU-lane tasks): raised so one modeled CPU expert takes
  the median measured task. During decoding the lane shares the cores with the driver thread,
  so a task takes longer than `calibrate-hw` measures on an idle machine.

Decode tokens only (token index ≥ 1).

The fast path (CUDA-graph segments, `runtime/graphed.py`) records neither one launch per expert nor its host
step in a trace, so its host costs are fitted from the records of a measured `bench` run instead
(``--records``, `fit_fast_path_costs`): every record holds the host's time per MoE layer with the GPU idle
(``host_us_per_layer``) and overlapped with a segment (``host_overlap_us_per_layer``), and what the layer moved.

- ``host_layer_us`` and ``host_copy_us``: the least-squares line of the GPU-idle host time per layer over the
  demand copies per layer, across the policies that neither prefetch nor use the CPU lane (``on_demand``,
  ``lru``): the host step's fixed part and its cost per copy issued;
- ``host_plan_us``: per prefetching record without the CPU lane, its overlapped host time per layer minus the
  non-prefetching records' (the recording both do) and the issue of its prefetch copies, the median.
- ``graph_step_kernel_us`` (with a `resident` record whose step was one CUDA graph): the GPU cost per kernel of
  that step, from its TPOT less the bytes the profile charges (`fit_graph_step_kernel_us`).

Records of one link only (the emulated links pace copies on the host). Pure: JSON in, numbers out.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from spice_core.errors import ConfigError
from spice_core.timing.profiles import HardwareProfile
from spice_core.timing.timeline import ONE_GRAPH_NOTE
from spice_core.tools.lane_fit import LANE_KEYS, fit_lane_costs, fit_line


# What every measured engine event's "args" must hold, and the types (bool is not a number).
_EVENT_ARGS = {"token": int, "layer": int, "lane": str, "kind": str, "start_ms": (int, float), "dur_ms": (int, float)}
MAX_TRACE_BYTES = 256 * 1024 * 1024     # decompressed; a long measured run is tens of MB


def read_trace_events(path: Path, flag: str = "--trace", timings: tuple[str, ...] = ("measured",)) -> list[dict]:
    """The complete ('X') events of a Chrome trace written by this engine (.json or .json.gz) whose timing is one
    of ``timings`` (the fit reads measured ones only), each checked to carry the fields the fit reads."""
    from spice_core.user_files import is_number, read_json

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{flag} {path}: no such file: export one with `bench` (\"export_traces\") or the app")
    data = read_json(path, flag, (dict, list), limit_bytes=MAX_TRACE_BYTES)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ConfigError(f"{flag} {path}: \"traceEvents\" is not a list: pass a Chrome trace written by this engine")
    out = []
    for i, e in enumerate(events):
        if not (isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("args"), dict)
                and e["args"].get("timing") in timings):
            continue
        a = e["args"]
        for key, typ in _EVENT_ARGS.items():
            v = a.get(key)
            if not isinstance(v, typ) or isinstance(v, bool) or (typ != str and not is_number(v)):
                raise ConfigError(f"{flag} {path}: event {i} has args.{key}={json.dumps(v)[:40]}, expected "
                                  f"{'a string' if typ is str else 'a number'}: pass a trace written by this engine")
        out.append(e)
    if not out:
        if timings == ("measured",):
            raise ConfigError(f"{flag} {path}: has no measured engine events: recalibrate from a measured (GPU) run")
        raise ConfigError(f"{flag} {path}: has no engine events: pass a Chrome trace written by this engine")
    return out


def read_records(paths: list[Path], flag: str = "--records") -> list[dict]:
    """The records of several `bench` results.json files, as one list."""
    from spice_core.user_files import read_json

    out = []
    for path in paths:
        if not Path(path).exists():
            raise ConfigError(f"{flag} {path}: no such file: pass the results.json a measured `bench` run wrote")
        data = read_json(Path(path), flag, list)
        if not all(isinstance(r, dict) for r in data):
            raise ConfigError(f"{flag} {path}: holds something other than records: pass a bench results.json")
        out.extend(data)
    return out


def read_traces(paths: list[Path], flag: str = "--trace") -> list[dict]:
    """Events of several traces (e.g. one per prompt) as one list; each trace's tokens are renumbered
    apart so their layers never mix."""
    out = []
    for i, path in enumerate(paths):
        for e in read_trace_events(path, flag):
            a = dict(e["args"])
            if a["token"] >= 1:
                a["token"] += i * 1_000_000
            out.append({**e, "args": a})
    return out


def _by_layer(events: list[dict]) -> dict[tuple[int, int], dict]:
    """(token, layer) -> {'layer': event, 'experts': [...], 'copies': [...], 'stalls': [...]} for decode tokens."""
    out: dict[tuple[int, int], dict] = {}
    for e in events:
        a = e["args"]
        if a["token"] < 1 or a["layer"] < 0:
            continue
        slot = out.setdefault((a["token"], a["layer"]), {"layer": None, "experts": [], "copies": [], "prefetches": [],
                                                         "stalls": []})
        kind, lane = a["kind"], a["lane"]
        if lane == "gpu" and kind == "layer" and not a.get("detail"):
            slot["layer"] = a
        elif lane == "gpu" and kind in ("expert", "approx"):
            slot["experts"].append(a)
        elif lane == "gpu" and kind == "stall":
            slot["stalls"].append(a)
        elif lane == "copy" and kind == "copy":
            slot["copies"].append(a)
        elif lane == "copy" and kind == "prefetch":
            slot["prefetches"].append(a)
    return {k: v for k, v in out.items() if v["layer"] is not None}


def fit_host_costs(events: list[dict], prefetch_events: list[dict] | None = None) -> dict:
    """Host costs in µs (see the module docstring), with the evidence each one rests on."""
    layers = _by_layer(events)
    if len(layers) < 8:
        raise ConfigError("the trace has fewer than 8 decode MoE layers: trace a longer generation")
    layer_ms = statistics.median(v["layer"]["dur_ms"] for v in layers.values())
    gaps, n_copies, launch = [], [], []
    for v in layers.values():
        lay_end = v["layer"]["start_ms"] + v["layer"]["dur_ms"]
        exps = sorted(v["experts"], key=lambda a: a["start_ms"])
        if not exps:
            continue
        gaps.append(exps[0]["start_ms"] - lay_end)
        n_copies.append(float(sum(1 for c in v["copies"] if c["start_ms"] <= exps[0]["start_ms"])))
        stall_starts = sorted(s["start_ms"] for s in v["stalls"])
        for a, b in zip(exps, exps[1:]):
            if not any(a["start_ms"] < s < b["start_ms"] for s in stall_starts):
                launch.append(b["start_ms"] - a["start_ms"])
    if not gaps:
        raise ConfigError("the trace's decode MoE layers launch no experts, as a fast-path (CUDA-graph) trace does not: "
                          "pass a measured trace of a run with --executor eager, or fit the fast path's host costs "
                          "from bench records with --records results.json")
    intercept_ms, copy_ms = fit_line(n_copies, gaps)
    fit = {
        "host_layer_us": 1e3 * (layer_ms + max(0.0, intercept_ms)),
        "host_copy_us": 1e3 * max(0.0, copy_ms),
        "host_expert_us": 1e3 * statistics.median(launch) if launch else 0.0,
        "evidence": {"decode_moe_layers": len(layers), "median_layer_ms": layer_ms,
                     "placement_gap_intercept_ms": intercept_ms, "copies_per_layer_mean": sum(n_copies) / len(n_copies),
                     "expert_launch_intervals": len(launch)},
    }
    tokens = {}
    for e in events:
        a = e["args"]
        if a["lane"] == "host" and a["kind"] == "token" and a["token"] >= 1:
            tokens[a["token"]] = a["dur_ms"]
    gpu_busy: dict[int, tuple[float, float]] = {}
    for e in events:
        a = e["args"]
        if a["lane"] == "gpu" and a["token"] >= 1:
            lo, hi = gpu_busy.get(a["token"], (float("inf"), float("-inf")))
            gpu_busy[a["token"]] = (min(lo, a["start_ms"]), max(hi, a["start_ms"] + a["dur_ms"]))
    outside = [tokens[t] - (hi - lo) for t, (lo, hi) in gpu_busy.items() if t in tokens]
    fit["host_step_us"] = 1e3 * max(0.0, statistics.median(outside)) if outside else 0.0
    if prefetch_events is not None:
        pl = _by_layer(prefetch_events)
        if len(pl) < 8:
            raise ConfigError("the prefetching trace has fewer than 8 decode MoE layers: trace a longer generation")
        p_layer_ms = statistics.median(v["layer"]["dur_ms"] for v in pl.values())
        # Prefetch events carry the layer they are for (possibly of the next token): count them all.
        n_prefetch = sum(1 for e in prefetch_events if e["args"]["token"] >= 1 and e["args"]["lane"] == "copy"
                         and e["args"]["kind"] == "prefetch")
        prefetch_per_layer = n_prefetch / len(pl)
        plan_ms = p_layer_ms - layer_ms - prefetch_per_layer * copy_ms
        fit["host_plan_us"] = 1e3 * max(0.0, plan_ms)
        fit["evidence"].update({"prefetch_median_layer_ms": p_layer_ms, "prefetches_per_layer": prefetch_per_layer})
    cpu = [e["args"]["dur_ms"] for e in [*events, *(prefetch_events or [])]
           if e["args"]["kind"] == "cpu_run" and e["args"]["token"] >= 1]
    if len(cpu) >= 10:
        fit["cpu_task_ms_median"] = statistics.median(cpu)
        fit["evidence"]["cpu_tasks"] = len(cpu)
    return fit


FAST_PATH_BASELINES = ("on_demand", "lru")          # copy every miss, never prefetch: the host step's line
FAST_PATH_PREFETCHERS = ("spice_prefetch", "spice", "spice_no_lore", "spice_no_cpu", "oracle_prefetch")


def fit_fast_path_costs(records: list[dict], moe_layers: int) -> dict:
    """Host costs in µs from measured fast-path `bench` records of one link (see the module docstring), with the
    evidence each one rests on. ``moe_layers``: the measured model's MoE layers per token."""
    if not isinstance(moe_layers, int) or moe_layers < 1:
        raise ConfigError(f"--moe-layers {moe_layers!r}: use the measured model's number of MoE layers (26 for "
                          "DeepSeek-V2-Lite's shapes, 28 for Qwen2-57B-A14B's)")
    rows = [r for r in records if r.get("timing") == "measured" and r.get("host_us_per_layer") is not None
            and r.get("n_decode_tokens")]
    if not rows:
        raise ConfigError("the records hold no measured fast-path run (host_us_per_layer): pass the results.json of "
                          "a `bench` run on a GPU")
    links = sorted({r.get("link") for r in rows})
    if len(links) > 1:
        raise ConfigError(f"the records mix links {links}: fit one link at a time (the emulated links pace copies "
                          "on the host)")

    def demand(r: dict) -> float:
        """Demand copies per MoE layer."""
        return (r.get("miss_split") or {}).get("copy", 0) / r["n_decode_tokens"] / moe_layers

    def label(r: dict) -> str:
        return str(r.get("policy")) + (f" ({r['variant']})" if r.get("variant") else "")

    no_lane = [r for r in rows if not (r.get("miss_split") or {}).get("cpu") and r.get("bytes_per_token") is not None]
    base = [r for r in no_lane if r.get("policy") in FAST_PATH_BASELINES]
    xs = [demand(r) for r in base]
    if len(base) < 2 or max(xs) - min(xs) < 0.5:
        raise ConfigError("fitting the host step needs on_demand and lru records (their copies per layer differ): "
                          "run both in the same bench config")
    intercept, slope = fit_line(xs, [r["host_us_per_layer"] for r in base])
    fit = {"host_layer_us": max(0.0, intercept), "host_copy_us": max(0.0, slope),
           "evidence": {"link": links[0], "moe_layers": moe_layers,
                        "baselines": {label(r): {"demand_copies_per_layer": round(demand(r), 3),
                                                 "host_us_per_layer": round(r["host_us_per_layer"], 1)}
                                      for r in base}}}
    recording = statistics.mean(r.get("host_overlap_us_per_layer") or 0.0 for r in base)
    # One expert's bytes, from a baseline (every byte it moved is a demand copy): prefetches are the rest.
    expert_bytes = statistics.median(r["bytes_per_token"] / (demand(r) * moe_layers) for r in base if demand(r) > 0)
    plans = {}
    for r in no_lane:
        if r.get("policy") not in FAST_PATH_PREFETCHERS or r.get("host_overlap_us_per_layer") is None:
            continue
        prefetches = max(0.0, r["bytes_per_token"] / expert_bytes / moe_layers - demand(r))
        plans[label(r)] = round(r["host_overlap_us_per_layer"] - recording - fit["host_copy_us"] * prefetches, 1)
    if plans:
        fit["host_plan_us"] = max(0.0, statistics.median(plans.values()))
        fit["evidence"]["plans_us"] = plans
        fit["evidence"]["recording_us_per_layer"] = round(recording, 1)
    return fit


def fit_graph_step_kernel_us(records: list[dict], profile: HardwareProfile, shape, moe_layers: int,
                             dense_layers: int, top_k: int) -> dict | None:
    """``graph_step_kernel_us`` from the measured `resident` records whose step was one CUDA graph (None when there
    are none): the median TPOT, less what the profile's memory bandwidth charges for the step's bytes (``shape``'s
    MoE and dense layers, and ``top_k`` routed experts a MoE layer), over its kernels (``gpu_kernels_per_layer`` a
    layer). The modeled one-graph step (`ModeledTimeline.one_graph_step`) then takes the measured time; other shapes
    and cells check it."""
    from spice_core.timing.costs import CostModel

    if not isinstance(dense_layers, int) or dense_layers < 0:
        raise ConfigError(f"--dense-layers {dense_layers!r}: use the measured model's number of dense decoder "
                          "layers (1 for DeepSeek-V2-Lite, 0 for Qwen2-57B-A14B)")
    if not isinstance(top_k, int) or top_k < 1:
        raise ConfigError(f"--top-k {top_k!r}: use the measured model's experts per token (6 for DeepSeek-V2-Lite, "
                          "8 for Qwen2-57B-A14B)")
    rows = [r for r in records if r.get("timing") == "measured" and r.get("policy") == "resident"
            and r.get("tpot_ms_median") and any(ONE_GRAPH_NOTE in str(n) for n in r.get("notes") or [])]
    if not rows:
        return None
    tpot_ms = statistics.median(r["tpot_ms_median"] for r in rows)
    bytes_only = CostModel(replace(profile, gpu_kernel_us=0.0), shape)
    bytes_ms = moe_layers * (bytes_only.gpu_layer_ms() + bytes_only.gpu_routed_read_ms(top_k))
    bytes_ms += dense_layers * bytes_only.gpu_layer_ms(dense=True)
    kernels = (moe_layers + dense_layers) * profile.gpu_kernels_per_layer
    if kernels < 1 or tpot_ms <= bytes_ms:
        raise ConfigError(f"resident's measured {tpot_ms:.2f} ms a token is no more than the {bytes_ms:.2f} ms the "
                          f"profile's {profile.gpu_mem_gbps:g} GB/s charges for its bytes: check --shape and "
                          "--moe-layers, or the profile's gpu_mem_gbps")
    return {"graph_step_kernel_us": (tpot_ms - bytes_ms) / kernels * 1e3,
            "evidence": {"resident_tpot_ms": round(tpot_ms, 3), "records": len(rows), "bytes_ms": round(bytes_ms, 3),
                         "kernels_per_step": kernels}}


def recalibrated_profile(profile: HardwareProfile, fit: dict, note: str = "", shape=None) -> HardwareProfile:
    """``shape``: the measured model's shape, to turn a measured CPU task into ``cpu_task_us``."""
    host_keys = ("host_layer_us", "host_copy_us", "host_expert_us", "host_plan_us", "host_step_us",
                 "graph_step_kernel_us")
    new = {k: round(float(fit[k]), 3 if k == "cpu_side_speedup" else 1) for k in (*host_keys, *LANE_KEYS) if k in fit}
    if "cpu_task_ms_median" in fit and shape is not None:
        from spice_core.timing.costs import CostModel
        modeled = CostModel(profile, shape).cpu_expert_ms()
        new["cpu_task_us"] = round(max(profile.cpu_task_us, profile.cpu_task_us + 1e3 * (fit["cpu_task_ms_median"]
                                                                                      - modeled)), 1)
    host = any(k in new for k in host_keys) or "cpu_task_us" in new
    what, suffix = ("host costs recalibrated", "+host") if host else ("CPU lane refitted", "+lane")
    src = (profile.source + "; " if profile.source else "") + f"{what} from measured runs" + (f" ({note})" if note else "")
    name = profile.name if profile.name.endswith(suffix) else profile.name + suffix
    return replace(profile, name=name, source=src, **new)


def add_cli(sub) -> None:
    from spice_core.tools import args as ca

    p = sub.add_parser("recalibrate", help="fit a profile's host costs from measured traces (see spice_core/tools/recalibrate.py)")
    p.add_argument("--profile", type=ca.path, required=True, help="profile JSON from calibrate-hw")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--trace", type=ca.path, nargs="+",
                     help="measured Chrome trace(s) of a policy without prefetching (lru), e.g. one per prompt")
    src.add_argument("--records", type=ca.path, nargs="+",
                     help="results.json of measured fast-path bench runs (one link; on_demand and lru, with "
                          "prefetching policies for the plan cost): fits the fast path's host step")
    p.add_argument("--link", default=None, help="with --records: the link whose records to fit (default: the only one)")
    p.add_argument("--moe-layers", type=int, default=26,
                   help="with --records: the measured model's MoE layers (26 for DeepSeek-V2-Lite, "
                        "28 for Qwen2-57B-A14B)")
    p.add_argument("--dense-layers", type=int, default=1,
                   help="with --records: the measured model's dense decoder layers (1 for DeepSeek-V2-Lite, "
                        "0 for Qwen2-57B-A14B), for resident's one-graph step")
    p.add_argument("--top-k", type=int, default=6,
                   help="with --records: the measured model's experts per token (6 for DeepSeek-V2-Lite, 8 for "
                        "Qwen2-57B-A14B), for resident's one-graph step")
    p.add_argument("--prefetch-trace", type=ca.path, nargs="+", default=None,
                   help="measured trace(s) of a prefetching policy")
    p.add_argument("--lane-records", type=ca.path, nargs="+", default=None,
                   help="results.json of measured runs with cpu_compute on two expert sizes (both models' lifts, "
                        "any link): fits the CPU lane's cpu_mem_gbps and cpu_job_compute_us, and "
                        "cpu_side_speedup where they measured it (tools/lane_fit.py)")
    p.add_argument("--shape", default="deepseek-v2-lite", help="the measured model's shape (for CPU-lane tasks)")
    p.add_argument("--out", type=ca.path, required=True)
    p.set_defaults(func=run)


def run(args) -> int:
    from spice_core.timing.profile_file import profile_from_file
    from spice_core.timing.profiles import get_shape
    from spice_core.user_files import check_writable_file

    shape = get_shape(args.shape)
    check_writable_file(args.out, "--out")
    prof = profile_from_file(args.profile, "--profile")
    if not (args.records or args.trace or args.lane_records):
        raise ConfigError("recalibrate needs --records, --trace or --lane-records: what to fit the profile from")
    fit, names = {}, ""
    if args.records:
        records = read_records(args.records)
        if args.link is not None:
            records = [r for r in records if r.get("link") == args.link]
            if not records:
                raise ConfigError(f"--link {args.link}: no record of that link in --records")
        fit = fit_fast_path_costs(records, args.moe_layers)
        graph = fit_graph_step_kernel_us(records, prof, shape, args.moe_layers, args.dense_layers, args.top_k)
        if graph is not None:
            fit["graph_step_kernel_us"] = graph["graph_step_kernel_us"]
            fit["evidence"]["graph_step"] = graph["evidence"]
        names = ", ".join(p.name for p in args.records) + f" (fast path, {fit['evidence']['link']} link)"
    elif args.trace:
        fit = fit_host_costs(read_traces(args.trace), read_traces(args.prefetch_trace, "--prefetch-trace")
                             if args.prefetch_trace else None)
        names = ", ".join(p.name for p in [*args.trace, *(args.prefetch_trace or [])])
    if args.lane_records:
        lane = fit_lane_costs(read_records(args.lane_records, "--lane-records"))
        fit.update({k: lane[k] for k in LANE_KEYS if k in lane})   # cpu_side_speedup: where records measured it
        fit["lane_evidence"] = lane["evidence"]
        names += ("; " if names else "") + "CPU lane from " + ", ".join(p.name for p in args.lane_records)
    new = recalibrated_profile(prof, fit, note=names, shape=shape)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(new.as_dict(), indent=2))
    for k, v in fit.items():
        print(f"{k}: {json.dumps(v) if isinstance(v, dict) else f'{v:.3f}' if k == 'cpu_side_speedup' else f'{v:.1f}'}")
    print(f"wrote {args.out}")
    return 0

"""Slot copies issued by the CUDA runtime's cudaMemcpyAsync directly (runtime/direct_copy.py) land the same bytes
as `Tensor.copy_`, in stream order; the copy engine takes that path on a GPU, the engine's run notes say which path
ran, and ``copy_issue="torch"`` (the A/B) gives the same tokens."""
import pytest
import torch

from tiny_models import build_tiny

from spice_core.policy.planner import CopyOrder


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny("qwen2_moe", tmp_path_factory.mktemp("tiny_direct") / "qwen2_moe")


def _engines(lm, n_slots, device):
    from spice_core.runtime.copies import CopyEngine
    from spice_core.timing.measured import MeasuredTimeline
    from spice_core.trace.recorder import Recorder

    made = []
    for direct in (True, False):
        cs = torch.cuda.Stream(device)
        clock = MeasuredTimeline(device, cs)
        made.append(CopyEngine(lm, n_slots, clock, Recorder(clock, lm.expert_bytes), copy_stream=cs,
                               compute_stream=clock.compute_stream, direct_copies=direct))
    return made


@pytest.mark.cuda
def test_direct_slot_copies_land_the_bytes_tensor_copy_lands_in_stream_order(tiny_dir):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from spice_core.model.loader import load_model

    lm = load_model(tiny_dir, "cuda")
    n_slots = 5
    direct, reference = _engines(lm, n_slots, torch.device("cuda"))
    assert direct.direct is not None, "the direct path was not taken on this GPU (see the log for why)"
    assert reference.direct is None
    keys = lm.host.keys()[:3 * n_slots]             # every slot refilled twice: the last copy into it must win
    for engine in (direct, reference):
        engine.clock.start_token(0)
        handles = engine.issue_many([CopyOrder(key, i % n_slots, "copy") for i, key in enumerate(keys)])
        for slot in range(n_slots):
            engine.wait_ready(slot)
        handles[-1].native.synchronize()
        engine.clock.end_token()
    torch.cuda.synchronize()
    assert torch.equal(direct.slots.buffer, reference.slots.buffer)
    for i, key in enumerate(keys[-n_slots:], start=len(keys) - n_slots):
        assert torch.equal(direct.slots.buffer[i % n_slots].cpu(), lm.host.flat(key))



@pytest.mark.cuda
@pytest.mark.parametrize("policy", ["lru", "on_demand"])
def test_the_fast_path_with_direct_copies_gives_tensor_copys_tokens_and_says_which_ran(policy):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from spice_core.api import RunSettings
    from spice_core.engine import SpiceEngine

    got = {}
    for issue in ("direct", "torch"):
        eng = SpiceEngine.load(None, device="cuda", executor="graphed", copy_issue=issue)
        run = eng.start_prompt("Tell me a story about a cat and a ball", RunSettings(policy=policy, cache_frac=0.25,
                                                                                     max_new_tokens=32))
        got[issue] = ([st.token_id for st in run], eng.get_summary(run.run_id).notes)
    assert got["direct"][0] == got["torch"][0]
    assert any(n == "slot copies: cudaMemcpyAsync called directly" for n in got["direct"][1]), got["direct"][1]
    assert any(n.startswith("slot copies: Tensor.copy_ (copy_issue=torch)") for n in got["torch"][1]), got["torch"][1]


class _FakeRuntime:
    """A CUDA runtime library as ctypes shows one: cudaRuntimeGetVersion writes its version."""

    def __init__(self, version: int) -> None:
        def get_version(ref):
            ref._obj.value = version
            return 0
        self.cudaRuntimeGetVersion = get_version


@pytest.mark.parametrize("mapped, versions, want", [
    (["/a/libcudart.so.12"], {"/a/libcudart.so.12": 11080}, "/a/libcudart.so.12"),       # one: that one
    (["/b/libcudart.so.11", "/a/libcudart.so.12"], {"/a/libcudart.so.12": 12080, "/b/libcudart.so.11": 11080},
     "/a/libcudart.so.12"),                                                             # PyTorch's version first
    (["/b/libcudart.so.11", "/a/libcudart.so.12"], {"/a/libcudart.so.12": 12090, "/b/libcudart.so.11": 11080},
     "/a/libcudart.so.12"),                                                             # then its major version
    (["/a/libcudart.so.12", "/b/libcudart.so.12"], {"/a/libcudart.so.12": 12080, "/b/libcudart.so.12": 12080},
     "/a/libcudart.so.12"),                                                             # a tie: map order
    (["/b/libcudart.so.11", "/c/libcudart.so.10"], {"/b/libcudart.so.11": 11080, "/c/libcudart.so.10": 10020},
     "/b/libcudart.so.11"),                                                             # none is: map order
    ([], {}, None),
])
def test_the_direct_path_prefers_pytorchs_cuda_runtime_among_those_mapped(monkeypatch, mapped, versions, want):
    from spice_core.runtime import direct_copy

    monkeypatch.setattr(direct_copy, "_mapped_cudarts", lambda: list(mapped))
    monkeypatch.setattr(direct_copy.ctypes, "CDLL", lambda path: _FakeRuntime(versions[path]))
    monkeypatch.setattr(direct_copy, "_torch_cuda_version", lambda: 12080)
    found = direct_copy._loaded_cudart()
    assert (found[0] if found else None) == want

"""SlotBuffer's allocation: a full-scale expert cache (~90 GiB) can fail on a GPU while a previous run's
slots wait for the cyclic garbage collector or sit in the caching allocator in blocks of the wrong size;
it collects, hands the cache back once and retries, and says what to change when memory is really short. The allocator is driven through
torch.empty; the CUDA calls are replaced by recorders (this machine has no GPU)."""
import pytest
import torch

from spice_core.memory.host_store import ExpertLayout
from spice_core.runtime import slots as slots_mod


def _layout():
    return ExpertLayout(hidden=4, intermediate=2, dtype=torch.float32)


def _patch(monkeypatch, failures):
    calls = {"empty": 0, "empty_cache": 0, "collect": 0}
    real_empty = torch.empty

    def empty(shape, dtype=None, device=None):
        calls["empty"] += 1
        if calls["empty"] <= failures:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 91.88 GiB")
        return real_empty(shape, dtype=dtype)          # stands in for the GPU allocation

    monkeypatch.setattr(slots_mod.torch, "empty", empty)
    monkeypatch.setattr(slots_mod.gc, "collect", lambda: calls.__setitem__("collect", calls["collect"] + 1))
    monkeypatch.setattr(slots_mod.torch.cuda, "empty_cache", lambda: calls.__setitem__("empty_cache", calls["empty_cache"] + 1))
    return calls


def test_one_out_of_memory_empties_the_cache_and_retries(monkeypatch):
    calls = _patch(monkeypatch, failures=1)
    buf = slots_mod.SlotBuffer(_layout(), 3, torch.device("cuda"))
    assert buf.buffer.shape == (3, _layout().numel)
    assert calls == {"empty": 2, "empty_cache": 1, "collect": 1}


def test_real_shortage_says_to_lower_the_budget(monkeypatch):
    calls = _patch(monkeypatch, failures=2)
    with pytest.raises(torch.OutOfMemoryError, match="lower the expert budget"):
        slots_mod.SlotBuffer(_layout(), 3, torch.device("cuda"))
    assert calls["empty_cache"] == 1


def test_on_the_cpu_out_of_memory_is_not_retried(monkeypatch):
    calls = _patch(monkeypatch, failures=1)
    with pytest.raises(torch.OutOfMemoryError):
        slots_mod.SlotBuffer(_layout(), 3, torch.device("cpu"))
    assert calls["empty_cache"] == 0

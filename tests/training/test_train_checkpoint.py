"""The training checkpoint round-trips through torch's weights-only loader and refuses anything else."""

import pytest
import torch

from training.train import CheckpointError, load_checkpoint, save_checkpoint


def _optimizer():
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    opt = torch.optim.AdamW([{"params": [params[0]], "weight_decay": 0.1}, {"params": [params[1]], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    (params[0].sum() + params[1].sum()).backward()
    opt.step()
    return params, opt


def test_checkpoint_round_trips_with_weights_only(tmp_path):
    params, opt = _optimizer()
    masters = [p.detach().clone() for p in params]
    path = tmp_path / "last.pt"
    save_checkpoint(path, step=7, tokens=1024, train_seconds=3.5, masters=masters, optimizer=opt.state_dict())
    state = torch.load(path, map_location="cpu", weights_only=True)     # what load_checkpoint relies on
    assert state["step"] == 7
    got = load_checkpoint(path)
    assert all(torch.equal(a, b) for a, b in zip(got["masters"], masters))
    fresh = torch.optim.AdamW([{"params": [params[0]]}, {"params": [params[1]]}], lr=1e-3)
    fresh.load_state_dict(got["optimizer"])
    assert not (tmp_path / "last.pt.tmp").exists()


class Payload:
    """An object a full unpickler would rebuild (and with __reduce__, could run code for)."""

    def __reduce__(self):
        return (print, ("this must never run",))


@pytest.mark.parametrize("content", ["pickle", "garbage", "not-a-dict"])
def test_resume_refuses_checkpoints_that_are_not_plain_state(tmp_path, content, capsys):
    path = tmp_path / "last.pt"
    if content == "pickle":
        torch.save({"step": 1, "tokens": 0, "train_seconds": 0.0, "masters": [], "optimizer": {}, "x": Payload()}, path)
    elif content == "garbage":
        path.write_bytes(b"not a checkpoint")
    else:
        torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match="--resume"):
        load_checkpoint(path)
    assert "this must never run" not in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--lr", "nan"], ["--minutes", "-1"], ["--seed", str(2**70)], ["--batch", "0"],
                                  ["--chat-fraction", "1.5"]])
def test_train_flags_refuse_non_finite_and_out_of_range_values(argv, capsys):
    from training.train import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err

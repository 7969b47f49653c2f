"""Exports are whole or absent (review: on a full disk the API's exports left a cut-short .trace.json that did not
load, and empty .gz and .csv files, at the names a reader opens)."""
from __future__ import annotations

import errno
import gzip
import json

import pandas as pd
import pytest

from spice_core.trace import export
from spice_core.trace.tensorboard import zip_dir


def _disk_full(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _only(folder, name):
    return sorted(p.name for p in folder.iterdir()) == [name]


def test_a_failed_json_export_leaves_the_earlier_file_and_no_scratch(tmp_path, monkeypatch):
    path = tmp_path / "run.trace.json.gz"
    export.write_json({"traceEvents": [1]}, path)
    monkeypatch.setattr(gzip.GzipFile, "write", _disk_full)
    with pytest.raises(OSError, match="No space left"):
        export.write_json({"traceEvents": [2]}, path)
    monkeypatch.undo()
    assert json.loads(gzip.decompress(path.read_bytes())) == {"traceEvents": [1]} and _only(tmp_path, path.name)


def test_a_failed_csv_export_leaves_nothing_at_its_name(tmp_path, monkeypatch):
    monkeypatch.setattr(pd.DataFrame, "to_csv", _disk_full)
    with pytest.raises(OSError):
        export.write_events_csv([], tmp_path / "events.csv")
    with pytest.raises(OSError):
        export.write_per_token_csv([], tmp_path / "per-token.csv")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_zip_leaves_nothing_at_its_name(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "w.pt.trace.json.gz").write_bytes(b"x" * 100)
    import zipfile

    monkeypatch.setattr(zipfile.ZipFile, "write", _disk_full)
    with pytest.raises(OSError):
        zip_dir(run, tmp_path / "out" / "tb.zip")
    assert list((tmp_path / "out").iterdir()) == []
    monkeypatch.undo()
    zpath = zip_dir(run, tmp_path / "out" / "tb.zip")
    assert zipfile.ZipFile(zpath).namelist() == ["run/w.pt.trace.json.gz"] and _only(tmp_path / "out", "tb.zip")


def test_an_export_has_a_plain_writes_permissions_and_goes_through_a_link(tmp_path):
    """Regression (review): the scratch file's 0600 stayed on every export, and a symlinked name was replaced by a file
    while its target kept the old export."""
    import os
    import stat

    fresh = export.write_json({"a": 1}, tmp_path / "fresh.json")
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    assert stat.S_IMODE(fresh.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
    os.chmod(plain, 0o640)
    export.write_json({"b": 2}, plain)
    assert stat.S_IMODE(plain.stat().st_mode) == 0o640
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    export.write_json({"c": 3}, link)
    assert link.is_symlink() and json.loads(target.read_text()) == {"c": 3}



def test_an_export_to_a_pipe_or_over_a_file_in_a_folder_it_cannot_add_to_is_written_in_place(tmp_path, monkeypatch):
    """Regression (review): with the scratch file, exporting to a pipe or device (/dev/stdout) replaced it by a
    regular file or failed, and so did exporting over a writable file in a folder this process may not add to,
    where a plain write works; both are written in place again."""
    import os
    import stat
    import tempfile
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    export.write_json({"d": 1}, fifo)
    reader.join(10)
    assert got and json.loads(got[0]) == {"d": 1} and stat.S_ISFIFO(fifo.stat().st_mode)
    # /dev/stdout when stdout is a pipe: a link to "pipe:[N]", which has no path of its own (review)
    r, w = os.pipe()
    try:
        export.write_json({"p": 2}, f"/proc/self/fd/{w}")
        os.close(w)
        w = -1
        assert json.loads(os.read(r, 1000)) == {"p": 2}
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)

    def refused(*_a, **_k):
        raise PermissionError(errno.EACCES, "Permission denied")

    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    monkeypatch.setattr(tempfile, "mkstemp", refused)      # the folder takes no new file (as for a non-root user)
    export.write_json({"e": 2}, kept)
    assert json.loads(kept.read_text()) == {"e": 2}
    with pytest.raises(PermissionError):
        export.write_json({"f": 3}, tmp_path / "new.json")    # no file to write in place: the plain error

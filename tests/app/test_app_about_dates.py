"""About's benchmark picker dates a file by its own text, else by its last commit, else not at all. Regression: a
file whose text has no date was dated by its modification time, so a fresh checkout showed every such file with
the checkout's date and "newest first" ordered nothing."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pages.about import benchmark_tables, git_dates

TABLE = "| a |\n|---|\n| 1 |\n"
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str, date: str | None = None) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
    if date:
        env |= {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org",
                    "-c", "commit.gpgsign=false", *args], check=True, capture_output=True, env=env)


def _commit(repo: Path, files: dict[str, str], date: str) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"at {date}", date=date)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A checkout whose benchmarks were committed on three days; every file's mtime is today's."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _commit(repo, {"bench/old.md": "# Old\n" + TABLE, "bench/texted.md": "Measured 2025-06-01.\n" + TABLE},
            "2025-01-10T12:00:00+00:00")
    _commit(repo, {"bench/mid.md": "# Mid\n" + TABLE}, "2025-02-20T12:00:00+00:00")
    _commit(repo, {"bench/sub/new.md": "# New\n" + TABLE, "bench/old.md": "# Old, rerun\n" + TABLE},
            "2025-03-30T12:00:00+00:00")
    return repo


def test_files_without_a_date_in_their_text_take_their_last_commits_date(repo):
    tables = benchmark_tables(repo / "bench")
    got = [(t.path.relative_to(repo / "bench").as_posix(), t.date) for t in tables]
    assert got == [("texted.md", "2025-06-01"), ("sub/new.md", "2025-03-30"), ("old.md", "2025-03-30"),
                   ("mid.md", "2025-02-20")]
    assert tables[1].commit_time_s == tables[2].commit_time_s > 0       # one commit: ordered by path, stable


def test_an_uncommitted_file_without_a_date_is_undated_and_listed_last(repo):
    (repo / "bench" / "draft.md").write_text("# Draft\n" + TABLE)
    tables = benchmark_tables(repo / "bench")
    assert tables[-1].path.name == "draft.md" and tables[-1].date == ""
    assert all(t.date for t in tables[:-1])


def test_outside_a_git_checkout_a_file_without_a_date_in_its_text_shows_none(tmp_path):
    (tmp_path / "a.md").write_text("# A\n" + TABLE)
    (tmp_path / "b.md").write_text("On 2024-05-05.\n" + TABLE)
    assert git_dates(tmp_path) == {}
    assert [(t.path.name, t.date) for t in benchmark_tables(tmp_path)] == [("b.md", "2024-05-05"), ("a.md", "")]


def test_a_shallow_clones_cut_off_commit_dates_nothing(repo, tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(clone)], check=True,
                   capture_output=True)
    tables = {t.path.name: t.date for t in benchmark_tables(clone / "bench")}
    assert tables == {"texted.md": "2025-06-01", "new.md": "", "old.md": "", "mid.md": ""}


def test_the_picker_and_the_source_line_name_no_date_for_an_undated_file(tmp_path):
    from fake_engine import FakeEngine
    from pages.about import AboutPage
    from pages.common import AppContext

    (tmp_path / "a.md").write_text("# A\n" + TABLE)
    (tmp_path / "b.md").write_text("On 2024-05-05.\n" + TABLE)
    ctx = AppContext.create(FakeEngine())
    try:
        page = AboutPage(ctx, tmp_path, tmp_path)
        picker, shown = page.on_load()
        assert picker["choices"] == [("b.md (2024-05-05)", "b.md"), ("a.md", "a.md")]
        assert shown.endswith("Source: `b.md` (2024-05-05)")
        assert page.show("a.md").endswith("Source: `a.md`")
    finally:
        ctx.exports.cleanup()


def test_a_file_that_is_not_utf8_is_left_out_not_the_whole_list(tmp_path):
    """Regression (review): one benchmark file with a Latin-1 byte was a UnicodeDecodeError traceback that emptied the
    About page's whole benchmark section."""
    (tmp_path / "good.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    (tmp_path / "latin1.md").write_bytes(b"| caf\xe9 | 1 |\n|---|---|\n| 1 | 2 |\n")
    assert [t.path.name for t in benchmark_tables(tmp_path)] == ["good.md"]

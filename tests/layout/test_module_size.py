"""STYLE.md's size rule, checked: a module of the project is split before it passes 600 lines (aim under ~400).
Every tracked Python file counts (engine, pages, app, benchmarks, training, scripts, tests); a file over the
limit is named with its length so the change that grew it can split it."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600


def _python_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
        files = [ROOT / line for line in out.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):      # not a git checkout (an unpacked release): walk the tree
        files = [p for p in ROOT.rglob("*.py") if ".git" not in p.parts and "site-packages" not in p.parts]
    return [p for p in files if p.is_file()]


def test_every_module_is_under_the_split_limit():
    files = _python_files()
    assert len(files) > 50, f"found only {len(files)} Python files under {ROOT}"
    over = sorted((n, str(p.relative_to(ROOT))) for p in files
                  if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES)
    assert not over, "split these modules (STYLE.md: split at 600 lines): " + ", ".join(f"{f} ({n})" for n, f in over)

"""Refresh docs/screenshots/ (chat, trace explorer, sweep, about) with the shipped model.

    python scripts/screenshots.py

Runs the browser tests' every-page flow and the phone and dark-mode checks (Debian chromium through Playwright) with
SPICE_SCREENSHOTS_DIR pointing at docs/screenshots/, so the pictures show exactly what the test
checks. Needs /usr/bin/chromium and assets/spice-mini/.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    if not (ROOT / "assets" / "spice-mini" / "config.json").exists():
        print("assets/spice-mini/ is missing: the screenshots must show the shipped model", file=sys.stderr)
        return 2
    env = dict(os.environ, SPICE_SCREENSHOTS_DIR=str(ROOT / "docs" / "screenshots"))
    flows = [("tests/app/test_app_browser.py", "shipped"),                   # chat, trace explorer, sweep, about
             ("tests/app/test_app_ux_browser.py", "phone or dark")]          # phone.png, dark.png
    for path, which in flows:
        rc = subprocess.call([sys.executable, "-m", "pytest", path, "-k", which, "-q", "-p", "no:cacheprovider"],
                             cwd=ROOT, env=env)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Installs everything the tests need (Python packages, Debian's chromium for the browser
# test) and runs the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# requirements.txt names the CPU wheel index (for Spaces); where it is unreachable, fail over at once
# instead of pip's five back-off retries per package.
export PIP_RETRIES="${PIP_RETRIES:-1}"
python -m pip install -q -r requirements-dev.txt
# The package itself, editable (with the installed setuptools; an old one without wheel builds in isolation).
python -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || python -m pip install -q --no-deps -e .
if ! command -v chromium >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
if [ "$#" -gt 0 ]; then          # a selection of tests: as asked, in this process
    exec python -m pytest "$@"
fi
# The whole suite in two phases. Everything but the browser tests in two worker processes (pytest-xdist; each worker
# builds its own tiny models and serves its own apps on free ports; SPICE_TEST_WORKERS=0 runs them in this process),
# then the browser tests alone, so that a page's pace never depends on what another worker is doing: in one phase
# of two workers a streaming page once answered key presses too slowly for its test. Both phases always run.
rc=0
python -m pytest -n "${SPICE_TEST_WORKERS:-2}" -m "not browser" || rc=$?
python -m pytest -m browser || rc=$?
exit $rc

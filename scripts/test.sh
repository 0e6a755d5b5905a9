#!/usr/bin/env bash
# Set everything up and run the checks CI runs: lint, format, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
# SkyPilot on its own step: it pins an older click than huggingface-hub asks for, which pip then only
# reports (both work); resolved together with ftorch[test], pip would instead backtrack for minutes
.venv/bin/python -c "import sky" >/dev/null 2>&1 || .venv/bin/python -m pip install --quiet "skypilot>=0.14.1,<0.15"
# the HTML report's test opens it in real headless Chromium (tests/browser.py): Debian's chromium, when
# missing and apt-get can install it (as root, or with passwordless sudo); the test skips, saying so, without it
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium; } \
        || echo "note: chromium not installed; the report's browser test will be skipped" >&2
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# two workers (tests/conftest.py starts the longest tests first, so both finish together)
exec .venv/bin/python -m pytest -q -n "${FTORCH_TEST_WORKERS:-2}" --dist worksteal "$@"

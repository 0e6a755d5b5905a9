#!/usr/bin/env bash
# Set everything up and run the checks CI runs: lint, format, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# the tests drive real SkyPilot objects: the same one route as a user's install, with the skypilot extra
scripts/setup.sh test,skypilot
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

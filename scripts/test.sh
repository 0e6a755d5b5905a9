#!/usr/bin/env bash
# Set everything up and run the checks CI runs: lint, format, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -q "$@"

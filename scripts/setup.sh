#!/usr/bin/env bash
# Create (or reuse) .venv in the repository and install ftorch into it, editable.
#   scripts/setup.sh [EXTRAS]     EXTRAS defaults to "test" (what the test suite needs)
# torch is installed first, pinned (FTORCH_TORCH overrides, e.g. FTORCH_TORCH="torch==2.9.1"), unless the
# venv already has one: an unpinned torch would pull a multi-GB CUDA build on a CPU-only machine.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/python -m pip install --quiet "${FTORCH_TORCH:-torch==2.13.0}"
fi
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
.venv/bin/python -c "import torch, transformers, peft, orchestrator, trainer" \
  || { echo "setup failed: the venv cannot import ftorch's dependencies" >&2; exit 1; }
echo "ftorch is set up in .venv ($(.venv/bin/ftorch --help >/dev/null && echo .venv/bin/ftorch works))"

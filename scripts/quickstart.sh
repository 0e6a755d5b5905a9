#!/usr/bin/env bash
# Set everything up and run the quickstart end to end: a LoRA fine-tune of a tiny model on this machine,
# preempted twice on purpose (once with notice, once without), recovering by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "${FTORCH_EXTRAS:-s3,plot}"  # plot: `ftorch status JOB --plot loss.png`
.venv/bin/python examples/make_quickstart.py
exec .venv/bin/ftorch launch examples/quickstart.yaml --follow "$@"

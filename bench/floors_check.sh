#!/usr/bin/env bash
# The declared minimum versions, checked: the trainer's tests run against transformers 4.56, peft 0.13 and
# datasets 3.0
# (pyproject's floors) laid over the project's venv, and with FLOORS_TORCH=1 against torch 2.8 as well
# (PyPI's torch 2.8 is a CUDA build of several GB that also runs on a CPU).
# Usage: bench/floors_check.sh [extra pytest args]; results go to docs/benchmarks.md by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${FLOORS_DIR:-/tmp/ftorch-floors}"
.venv/bin/python -m pip install --quiet --target "$target" --no-deps \
    "transformers==4.56.2" "peft==0.13.2" "datasets==3.0.0" "huggingface-hub>=0.34,<1.0" \
    "tokenizers>=0.22,<0.23"
if [[ "${FLOORS_TORCH:-0}" == 1 ]]; then  # with its own CUDA libraries (and triton), so that it imports
    .venv/bin/python -m pip install --quiet --target "$target/torch28" "torch==2.8.0"
    target="$target:$target/torch28"
fi
PYTHONPATH="$target:$PWD" .venv/bin/python -c \
    "import torch, transformers, peft, datasets; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'datasets', datasets.__version__)"
PYTHONPATH="$target:$PWD" OMP_NUM_THREADS=1 FTORCH_HOME="$(mktemp -d)" .venv/bin/python -m pytest -q -n 0 \
    -p no:cacheprovider \
    tests/trainer_tests/checkpoints/test_exact_resume.py::test_sigterm_checkpoints_exits_preempted_and_resumes_bitwise \
    tests/trainer_tests/model/test_qlora.py tests/trainer_tests/outputs/test_export.py tests/trainer_tests/memory/test_lean_trainer.py tests/trainer_tests/data/test_data.py \
    tests/trainer_tests/test_fsdp.py::test_sharded_checkpoint_layout_and_manifest tests/trainer_tests/data/test_packing.py \
    tests/trainer_tests/model/test_sharded_load.py tests/trainer_tests/data/test_data_sources.py tests/trainer_tests/checkpoints/test_sharded_export.py "$@"

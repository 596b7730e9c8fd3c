#!/usr/bin/env bash
# Install charlm with its dev extra into .venv (same install as demo.sh), then lint and test.
# pytest runs both folders of pyproject's testpaths: tests/unit (each module alone, seconds),
# then tests/integration (training runs, the CLI as a process, torchrun, the tune databases).
# Arguments go to pytest (`bash scripts/test.sh tests/unit`, `-k NAME`, `-n 0`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EXTRAS=dev,hf,tune,serve,onnx source scripts/install.sh
ruff check .
pytest "$@"

#!/usr/bin/env bash
# Install charlm with its dev extra into .venv (same install as demo.sh), then lint and test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EXTRAS=dev,hf,tune source scripts/install.sh
ruff check .
pytest "$@"

#!/usr/bin/env bash
# A fresh clone to a trained model and a sample: install into .venv (a CPU build of torch where
# there is no CUDA GPU), train the CPU recipe on tiny-shakespeare, print 500 characters from the
# best checkpoint. Run it again and it reuses .venv and starts the run over.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install.sh
charlm train configs/shakespeare_char_cpu.yaml --overwrite
echo
echo "--- 500 characters from runs/shakespeare_char_cpu/best.pt ---"
charlm sample runs/shakespeare_char_cpu --max-new-tokens 500 --seed 1337

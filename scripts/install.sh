#!/usr/bin/env bash
# Creates (or reuses) .venv and installs charlm into it. Sourced by demo.sh and test.sh.
#   EXTRAS: pip extras to install, e.g. "dev" (default: none)
# On a machine without a CUDA GPU, torch comes from a CPU build: a local wheel that pip can
# see without downloading (pip's find-links) if there is one, else PyTorch's CPU index.
# A GPU user installs the CUDA torch of their choice first; this script then leaves it alone.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="$venv/bin/python"
torch_version="${CHARLM_TORCH_VERSION:-2.13.0}"
extras="${EXTRAS:-}"

if [ ! -x "$py" ]; then
  echo "charlm: creating $venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi

if ! "$py" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "charlm: CUDA GPU found, installing torch from PyPI (CUDA build)"
    "$py" -m pip install --quiet "torch>=2.10"
  else
    echo "charlm: no CUDA GPU, installing a CPU build of torch"
    # --no-index: torch itself only from a local wheel (no download); its own needs from the index.
    if "$py" -m pip install --quiet --no-index --no-deps "torch==$torch_version" 2>/dev/null; then
      "$py" -m pip install --quiet "torch==$torch_version"
    else
      "$py" -m pip install --quiet --index-url https://download.pytorch.org/whl/cpu "torch>=2.10"
    fi
  fi
fi

# Reinstall charlm only when pyproject.toml or the extras changed (keeps a second run fast).
stamp="$venv/.charlm-install-${extras:-base}"
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1) extras=$extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  spec="$root"
  [ -n "$extras" ] && spec="$root[$extras]"
  echo "charlm: installing charlm${extras:+ [$extras]} into $venv"
  "$py" -m pip install --quiet -e "$spec"
  echo "$want" >"$stamp"
fi
export PATH="$venv/bin:$PATH"

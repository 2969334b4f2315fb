#!/usr/bin/env bash
# Build, test and package the VS Code extension: npm ci, compile, unit tests, .vsix.
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund
npm run compile
npm test
# The bundle (dist/extension.js) carries vscode-languageclient, so no node_modules in the .vsix.
npx --no-install vsce package --no-dependencies --allow-missing-repository --out kernel-lsp.vsix
echo "built $(pwd)/kernel-lsp.vsix"

#!/usr/bin/env bash
# What a GPU machine without our packages needs, made here (repo root, git-ignored folders), for
# benchmarks/gpu_sandboxed_tests.sh and benchmarks/gpu_steps.sh:
#   .whl/      the LSP, agent and test packages as cp312 manylinux wheels, and this checkout's own
#   .deb/root  bubblewrap, unpacked (the sandbox candidates run in)
#   benchmarks/corpus/inline_build  the public KernelBench solutions, when REPO_DIR names a clone of
#              anneouyang/KernelBenchLeaderboard (benchmarks/gather_inline_corpus.py checks each sha256)
#   bash benchmarks/gpu_prep.sh [REPO_DIR]
# PY (default python3) is the interpreter whose pip downloads. A second run keeps what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DL=("$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d .whl)
mkdir -p .whl
# The ranges pyproject.toml pins, and what they need that the device image lacks (openai 1.x: its
# 2.x and later need httpx2, which the image has not).
"${DL[@]}" pygls "lsprotocol==2025.0.0" cattrs attrs "tree-sitter>=0.25,<0.27" "tree-sitter-cuda>=0.21.2,<0.22" \
  "tree-sitter-python>=0.23,<0.26" "watchdog>=4,<8" pytest-lsp "pytest-asyncio>=0.24,<2" "openai>=1.60,<2" \
  pydantic jiter distro sniffio annotated-types typing-inspection "typing_extensions>=4.16" "rich>=13,<16" \
  markdown-it-py mdurl pygments 2>&1 | grep -v "^WARNING" || true
# pydantic pins its core exactly: the version its metadata names.
core=$(unzip -p .whl/pydantic-[0-9]*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p' | head -1)
"${DL[@]}" "pydantic-core==$core" 2>&1 | grep -v "^WARNING" || true
rm -f .whl/kernel_lsp-*.whl
"$PY" -m pip wheel -q --no-deps -w .whl . 2>&1 | grep -v "^WARNING" || true
mkdir -p .deb
if [ ! -x .deb/root/usr/bin/bwrap ]; then
  (cd .deb && apt-get download bubblewrap >/dev/null 2>&1 && dpkg -x bubblewrap_*.deb root)
fi
if [ -n "${1:-}" ]; then
  "$PY" benchmarks/gather_inline_corpus.py --repo-dir "$1"
fi
echo "gpu_prep: $(ls .whl | wc -l) wheels ($(du -sh .whl | cut -f1)), bwrap: $(ls .deb/root/usr/bin/bwrap 2>/dev/null || echo missing)," \
     "corpus: $(ls benchmarks/corpus/inline_build 2>/dev/null | wc -l) pairs; carry .whl .deb benchmarks/corpus"

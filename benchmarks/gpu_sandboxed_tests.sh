#!/usr/bin/env bash
# Every gpu test inside the sandbox on a GPU machine that has torch but no bubblewrap or LSP packages.
# Prepare here (repo root): `bash benchmarks/gpu_prep.sh` does all of the following. the LSP/openai wheels for cp312 in .whl/ (pip download --no-deps ...: pygls,
# lsprotocol==2025.0.0, cattrs, tree-sitter, tree-sitter-cuda, tree-sitter-python, watchdog, pytest-lsp,
# pytest-asyncio, and 'openai<2' with pydantic, pydantic-core, jiter, distro, sniffio, annotated-types,
# typing-inspection: openai 3.x needs httpx2, which the device image lacks, and its tests then skip), and
# bubblewrap unpacked: mkdir -p .deb && cd .deb && apt-get download bubblewrap && dpkg -x bubblewrap_*.deb root.
# Then on the GPU machine (carry .whl and .deb):  OUT=/some/dir bash benchmarks/gpu_sandboxed_tests.sh
# Groups: sandbox engine accuracy edges agent examples split wholemodel nollm early turns start raygpu cost (about 100-400 s each;
# split, with its full torch builds, up to 400 s on a cold machine).
set -u
cd "$(dirname "$0")/.."; OUT=${OUT:-$PWD/.gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PATH="$PWD/.deb/root/usr/bin:$PATH"
# Sandboxed means sandboxed: a test that needs bubblewrap fails here instead of skipping (tests/needs.py).
export KERNEL_LSP_REQUIRE_SANDBOX=1
# Ray's wheels too when carried (.whl-ray: benchmarks/ray_wheels.sh), for the Ray server test.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /opt/site .whl/*.whl \
  $(ls .whl-ray/*.whl 2>/dev/null) >/dev/null 2>&1 || echo "wheel install failed"
export PATH="/opt/site/bin:$PATH"
export PYTHONPATH=/opt/site
bwrap --version; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'from kernel_lsp.engine import sandbox as s; print("sandbox:", s.status().message())'
# ONLY="sandbox engine" runs only those groups: all of them take longer than one 10-minute call.
run() { local name=$1; shift; [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]] && return; local t0=$SECONDS; timeout "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/$name.log)"; }
P="python3 -m pytest -q -ra -p no:cacheprovider -m gpu"
run sandbox 150 $P tests/engine/test_gpu_sandbox.py
run engine 300 $P tests/engine/test_gpu_engine.py tests/engine/test_gpu_shared.py tests/engine/test_gpu_faults.py tests/engine/test_gpu_baselines.py
run accuracy 420 $P -s tests/engine/test_gpu_accuracy.py tests/engine/test_gpu_verdicts_round2.py
run edges 470 $P -s tests/engine/test_gpu_edges.py
run agent 330 $P tests/agent/test_gpu.py tests/test_server_gpu.py tests/cli/test_cli_gpu.py
run examples 240 $P tests/test_examples.py
# SPLIT_K narrows the split-build group (its full torch builds take minutes on a cold machine).
run split 420 $P tests/engine/test_inline_split_gpu.py ${SPLIT_K:+-k "$SPLIT_K"}
run wholemodel 120 $P tests/agent/test_whole_model_gpu.py
run nollm 560 $P -s tests/nollm/test_gpu.py
run early 180 $P -s tests/engine/test_early_result.py
run turns 240 $P -s tests/engine/test_gpu_turns.py
run start 240 python3 -m pytest -q -ra -p no:cacheprovider -s tests/engine/test_gpu_worker_start.py tests/engine/test_worker_starts.py
python3 -c "import ray" 2>/dev/null && run raygpu 420 $P -s tests/ray/test_server_ray_gpu.py
run cost 30 python3 benchmarks/sandbox_cost.py --starts 10 --torch-starts 3 --out-dir "$OUT"
grep -h "passed\|failed\|FAILED\|ERROR" "$OUT"/*.log | head -60

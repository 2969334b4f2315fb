#!/usr/bin/env bash
# Several GPU runs in one call on a lent GPU machine, each under its own time cap, their logs in one
# tarball: a machine is lent for minutes, so the runs that belong together go in one command.
#   OUT=/some/dir STEPS="g_turns:100 py_four:330 sh_nollm:560" py_four="tests/engine/test_gpu_edges.py -k four" \
#     sh_nollm="mkdir -p \$OUT/r; cp benchmarks/results/no_llm_full.* \$OUT/r/; python3 benchmarks/no_llm.py --stop-after 400 --resume --out \$OUT/r/no_llm_full" \
#     bash benchmarks/gpu_steps.sh
# Only $OUT comes back from the machine, and a step cut at its cap takes the rest of its command
# with it (a `; cp results $OUT` after the run never runs): steps write their results into $OUT
# themselves, and a --resume step finds the earlier results copied there first.
# A step is NAME:SECONDS. g_<group>: that group of benchmarks/gpu_sandboxed_tests.sh (ONLY=<group>);
# py*: pytest -m gpu -s with the arguments in the variable of that name (parsed by bash: -k 'a or b' works); sh*: the command in the
# variable of that name. Prepare here with `bash benchmarks/gpu_prep.sh [KernelBenchLeaderboard clone]`
# (.whl with this checkout's own wheel, .deb, the corpus); carry .whl and .deb (and benchmarks/corpus
# for runs over the corpus). Each step prints its last line, exit code and seconds; $OUT/logs.tgz holds
# every log.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.gpu-out}
export PYTHONUNBUFFERED=1 KERNEL_LSP_REQUIRE_SANDBOX=1
L=$OUT/logs; mkdir -p "$L"
export KERNEL_LSP_GPU_TEST_LOGS=$L  # tests that start benches keep their progress here (a cut run still tells)
[ -n "${GPU_STEPS_NO_INSTALL:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /opt/site .whl/*.whl \
  >/dev/null 2>&1 || echo "wheel install failed"
export PATH="$PWD/.deb/root/usr/bin:/opt/site/bin:$PATH" PYTHONPATH=/opt/site
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi here"
# A step runs in a process group of its own, stopped whole at its cap: SIGTERM, and SIGKILL 5 s
# later for what is still there (`timeout` sends SIGTERM only, and what ignores it or is busy in
# a CUDA call ran on beside the next step).
capped() {  # capped SECONDS LOG COMMAND...: exit code 124 when cut
  local cap=$1 log=$2 t=0; shift 2
  setsid "$@" > "$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null && [ "$t" -lt "$cap" ]; do sleep 1; t=$((t + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null; sleep 5; kill -KILL -- "-$pid" 2>/dev/null; wait "$pid"; return 124
  fi
  wait "$pid"
}
for s in ${STEPS:-}; do
  name=${s%%:*}; cap=${s##*:}; t=$SECONDS
  case $name in
    g_*) capped "$cap" "$L/$name.driver.log" env ONLY="${name#g_}" OUT="$L" bash benchmarks/gpu_sandboxed_tests.sh
         rc=$?; tail -1 "$L/${name#g_}.log" 2>/dev/null ;;
    py*) capped "$cap" "$L/$name.log" bash -c "python3 -m pytest -q -ra -p no:cacheprovider -m gpu -s ${!name}"
         rc=$?; tail -1 "$L/$name.log" ;;
    sh*) capped "$cap" "$L/$name.log" bash -c "${!name}"; rc=$?; tail -3 "$L/$name.log" ;;
    *) echo "unknown step $name (g_<group>, py*, sh*)"; rc=2 ;;
  esac
  echo "== $name rc=$rc $((SECONDS-t))s"
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs

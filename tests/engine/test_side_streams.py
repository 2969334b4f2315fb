"""Streams made or chosen in CUDA text flag `side_stream`, and a side_stream candidate is never
credited (issue 20: a load_inline kernel on a cudaStreamCreateWithFlags stream read `correct`,
1.24x eager, exit 0). CPU only: the scan, the engine's crediting rule and `bench`'s exit status;
tests/engine/test_gpu_edges.py runs the same file on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_lsp.engine.worker.judge import static_checks, stream_args
from kernel_lsp.model import Candidate, Evaluation

CHEATS = Path(__file__).parent / "cheats"
RACE = (CHEATS / "inline_side_stream.py").read_text()
# The same candidate on the caller's stream: nothing to flag.
CLEAN = RACE.replace("    cudaStream_t s;\n    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);\n",
                     "    cudaStream_t s = at::cuda::getCurrentCUDAStream();\n")


def _lines(source: str, kind: str = "python") -> dict[int, str]:
    return {f["line"]: f["why"] for f in static_checks.scan(source, kind) if f["flag"] == "side_stream"}


def test_the_credited_race_is_flagged_where_it_makes_and_uses_the_stream() -> None:
    lines = RACE.splitlines()
    made = 1 + next(i for i, ln in enumerate(lines) if "cudaStreamCreateWithFlags(&s" in ln)
    launch = 1 + next(i for i, ln in enumerate(lines) if "<<<" in ln)
    found = _lines(RACE)
    assert set(found) == {made, launch}, found
    assert "stream `s`" in found[launch] and "current stream" in found[launch]


def test_a_same_file_candidate_is_scanned_as_the_engine_scans_it() -> None:
    """Model and ModelNew in one file: the engine passes the file as the reference too. Only the
    reference's own blocks excuse lines; the CUDA text is the candidate's (on the H200 the race
    read `side_stream` from the run only, its CUDA text excused as "the reference's")."""
    assert "class Model(" in RACE and "class ModelNew(" in RACE  # one file, both
    found = {f["line"] for f in static_checks.scan(RACE, "python", RACE) if f["flag"] == "side_stream"}
    assert found == set(_lines(RACE)) and found
    # A separate reference still excuses the lines it holds itself (an extracted op keeps them).
    ref = "\n".join(ln for ln in RACE.splitlines() if "ModelNew" not in ln)
    assert {f["line"] for f in static_checks.scan(RACE, "python", ref) if f["flag"] == "side_stream"} == set()


def test_the_same_kernel_on_the_current_stream_is_not_flagged() -> None:
    assert CLEAN != RACE and "getCurrentCUDAStream" in CLEAN
    assert _lines(CLEAN) == {}


def test_a_side_stream_candidate_is_not_counted_and_bench_exits_1() -> None:
    pytest.importorskip("torch")
    from kernel_lsp.cli.bench import status
    from kernel_lsp.engine.worker import run
    from kernel_lsp.verdicts import evaluation_reason

    cand = Candidate(source=RACE, kind="python")
    findings = static_checks.scan(cand.source, cand.kind)
    ev = Evaluation(task="relu", candidate=cand.id, verdict="correct", correct=True, message="correct on 3 input sets",
                    flags=static_checks.flags(findings))
    run._finish(ev, {"static": findings}, [], cand)  # what the engine does once verify and bench are done
    assert "side_stream" in ev.flags and "not_counted" in ev.flags
    assert ev.custom_kernel is True  # a custom kernel, and still not credited
    assert status(ev) == 1
    assert "not counted (side_stream)" in evaluation_reason(ev)
    # The clean twin counts: the check is what makes the difference.
    twin = Candidate(source=CLEAN, kind="python")
    ok = Evaluation(task="relu", candidate=twin.id, verdict="correct", correct=True, message="correct",
                    flags=static_checks.flags(static_checks.scan(twin.source, twin.kind)))
    run._finish(ok, {}, [], twin)
    assert "not_counted" not in ok.flags and status(ok) == 0


CURRENT = [
    "void f(float* x, cudaStream_t stream) { k<<<1, 32, 0, stream>>>(x); }",           # the caller's
    "void f(float* x, void* stream) { k<<<1, 32, 0, (cudaStream_t)stream>>>(x); }",
    "void f(float* x) { k<<<1, 32, 0, at::cuda::getCurrentCUDAStream()>>>(x); }",
    "void f(float* x) { k<<<1, 32, 0, c10::cuda::getCurrentCUDAStream().stream()>>>(x); }",
    "void f(float* x) { auto s = at::cuda::getCurrentCUDAStream(); cudaStream_t t = s; k<<<1, 32, 0, t>>>(x); }",
    "void f(float* x) { k<<<1, 32>>>(x); k<<<1, 32, 128>>>(x); k<<<1, 32, 0, 0>>>(x); k<<<1, 32, 0, nullptr>>>(x); }",
    "void f(float* a, float* b) { cudaMemcpyAsync(a, b, 4, cudaMemcpyDeviceToDevice); }",   # default stream
    "void f(float* x) { // k<<<1, 32, 0, side>>>(x);\n}",                                  # a comment
]
FOREIGN = [
    ("void f(float* x) { cudaStream_t s; cudaStreamCreate(&s); k<<<1, 32, 0, s>>>(x); }", "s"),
    ("static cudaStream_t side = nullptr;\nvoid f(float* x) {\n if (!side) cudaStreamCreateWithPriority(&side, 0, -1);\n"
     " k<<<1, 32, 0, side>>>(x); }", "side"),
    ("void f(float* x) { auto p = at::cuda::getStreamFromPool(); k<<<dim3(1, 2), dim3(32, (1)), 0, p.stream()>>>(x); }",
     "p.stream()"),
    ("void f(float* x) { k<<<1, 32, 0, cudaStreamPerThread>>>(x); }", "cudaStreamPerThread"),
    ("void f(float* a, float* b, cudaStream_t s2) {\n cudaMemcpyAsync(a, b, 4, cudaMemcpyDeviceToDevice, s3); }", "s3"),
    ("void f(cublasHandle_t h, cudaStream_t mine) { cudaStreamCreateWithFlags(&mine, 1); cublasSetStream(h, mine); }",
     "mine"),
    ("void f(void** args) { cudaLaunchConfig_t cfg = {}; cfg.stream = streams[1]; }", "streams[1]"),
]


@pytest.mark.parametrize("code", CURRENT)
def test_launches_on_the_current_stream_pass(code: str) -> None:
    assert stream_args.foreign_launches(code) == []


@pytest.mark.parametrize("code, stream", FOREIGN)
def test_launches_on_other_streams_are_found(code: str, stream: str) -> None:
    found = stream_args.foreign_launches(code)
    assert [s for _, s, _ in found] and all(s == stream for _, s, _ in found), found


def test_a_source_written_as_one_line_strings_is_scanned_too() -> None:
    # "cudaStreamCreate(&s);\n" with an escaped newline: no other mark of C code in the string.
    src = ('from torch.utils.cpp_extension import load_inline\n'
           'cuda = ("torch::Tensor go(torch::Tensor x) {"\n'
           '        "  cudaStream_t s;"\n'
           '        "  cudaStreamCreate(&s);\\n"\n'
           '        "  k<<<1, 1, 0, s>>>(x.data_ptr<float>());\\n"\n'
           '        "  auto cur = at::cuda::getCurrentCUDAStream();\\n"\n'
           '        "  k<<<1, 1, 0, cur>>>(x.data_ptr<float>());\\n"\n'
           '        "  return x; }")\n')
    assert set(_lines(src)) == {4, 5}  # the made stream and its launch; the launch on `cur` passes


def test_a_cu_file_is_scanned_for_launch_streams() -> None:
    found = _lines((CHEATS / "gpu_relu2_sidestream.cu").read_text(), "cuda")
    text = (CHEATS / "gpu_relu2_sidestream.cu").read_text().splitlines()
    assert {ln for ln in found if "<<<" in text[ln - 1]} == {25, 26}
    assert _lines((CHEATS / "gpu_relu2_fast.cu").read_text(), "cuda") == {}

"""Running nvcc: the on-save check (`compile_check`, a cubin with ptxas' report, async
and cancellable) and the fast build of an extern "C" launcher (`build_library`, sync)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from kernel_lsp.model import CompileResult, Diagnostic, Span
from kernel_lsp.toolchain.demangle import demangle, function_name
from kernel_lsp.toolchain.diagnostics import Placement, launch_bounds_map, parse_messages
from kernel_lsp.toolchain.nvcc import (
    CompileOptions,
    ToolchainError,
    find_nvcc,
    nvcc_command,
    nvcc_version,
    torch_include_paths,
    validate_arch,
)
from kernel_lsp.toolchain.occupancy import arch_limits, occupancy
from kernel_lsp.toolchain.ptxas import parse_resources

log = logging.getLogger(__name__)

LineMap = Callable[[int, int], tuple[int, int]]

NVCC_SETTING = "the `nvcc` setting (kernelLsp.nvcc in the editor, nvcc in [tool.kernel-lsp])"
ARCH_SETTING = "the `arch` setting (kernelLsp.arch in the editor, arch in [tool.kernel-lsp])"

_MEMORY_CACHE_SIZE = 256
_memory_cache: collections.OrderedDict[str, dict] = collections.OrderedDict()


def clear_cache() -> None:
    """Forget in-memory results (tests; a changed toolchain is already part of the key)."""
    _memory_cache.clear()


# ----------------------------------------------------------------- setup problems


def _setup_failure(message: str, code: str, command: list[str] | None = None, log_text: str = "") -> CompileResult:
    return CompileResult(ok=False, diagnostics=[Diagnostic(Span(0, 0, 0, 0), "error", message,
                                                           source="kernel-lsp", code=code)],
                         log=log_text or message, command=command or [])


def _resolve(options: CompileOptions) -> tuple[str, str] | CompileResult:
    """(nvcc path, version), or the one-diagnostic result that says what is wrong."""
    problem = validate_arch(options.arch)
    if problem:
        return _setup_failure(f"{problem}. Set {ARCH_SETTING} to a GPU architecture such as sm_90.",
                              "bad-arch")
    nvcc = find_nvcc(options.nvcc)
    if nvcc is None:
        if options.nvcc and options.nvcc != "nvcc":
            msg = f"nvcc not found at {options.nvcc!r}. Fix {NVCC_SETTING} to point at an nvcc executable."
        else:
            msg = ("nvcc was not found ($CUDA_HOME/bin, PATH, /usr/local/cuda/bin). Install the CUDA "
                   f"toolkit, or set {NVCC_SETTING} to its path.")
        return _setup_failure(msg, "nvcc-missing")
    if not os.access(nvcc, os.X_OK):
        return _setup_failure(f"nvcc at {nvcc} is not executable. Fix its permissions or {NVCC_SETTING}.",
                              "nvcc-broken")
    try:
        version = nvcc_version(nvcc)
    except ToolchainError as exc:
        return _setup_failure(f"{exc}. Set {NVCC_SETTING} to a working nvcc.", "nvcc-broken")
    return nvcc, version


def _fatal_setup(log_text: str, options: CompileOptions, version: str, command: list[str]) -> CompileResult | None:
    """nvcc refused to start the compile (unknown arch and the like): one clear diagnostic."""
    m = re.search(r"nvcc fatal\s*:\s*Unsupported gpu architecture '([^']+)'", log_text)
    if m:
        return _setup_failure(
            f"nvcc {version} does not support the GPU architecture {m.group(1)!r}. Set {ARCH_SETTING} "
            "to one it supports, e.g. sm_90 (`nvcc --list-gpu-arch` lists them).",
            "bad-arch", command, log_text)
    m = re.search(r"nvcc fatal\s*:\s*Value '([^']+)' is not defined for option '([^']+)'", log_text)
    if m:
        return _setup_failure(f"nvcc {version} rejects {m.group(1)!r} for --{m.group(2)}. Check "
                              f"{ARCH_SETTING} and the extra flags setting.", "bad-option", command, log_text)
    m = re.search(r"nvcc fatal\s*:\s*(Unknown option .*)", log_text)
    if m:
        return _setup_failure(f"nvcc {version}: {m.group(1).strip()}. Check the `extraFlags` setting.",
                              "bad-option", command, log_text)
    return None


# ----------------------------------------------------------------- shared parts


def _temp_name(path: str) -> str:
    base = os.path.basename(path) or "source.cu"
    return base if base.endswith((".cu", ".cuh")) else base + ".cu"


def _with_user_dir(options: CompileOptions, path: str) -> tuple[CompileOptions, str | None]:
    """The document's directory goes on the include path, so `#include "x.cuh"` works."""
    user_dir = os.path.dirname(os.path.abspath(path)) if path else None
    if user_dir and os.path.isdir(user_dir) and user_dir not in options.include_paths:
        options = dataclasses.replace(options, include_paths=[*options.include_paths, user_dir])
    elif user_dir and not os.path.isdir(user_dir):
        user_dir = None
    return options, user_dir


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def _header_stamps(source: str, user_dir: str | None, include_paths: list[str]) -> str:
    """Sizes and mtimes of the quoted headers the source names, so editing one misses the cache."""
    stamps = []
    for name in _LOCAL_INCLUDE.findall(source):
        for directory in [user_dir, *include_paths]:
            if not directory:
                continue
            candidate = os.path.join(directory, name)
            try:
                st = os.stat(candidate)
            except OSError:
                continue
            stamps.append(f"{candidate}:{st.st_size}:{st.st_mtime_ns}")
            break
    return "|".join(stamps)


def _cache_key(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def _finish(source: str, path: str, options: CompileOptions, nvcc: str, log_text: str,
            returncode: int, user_dir: str | None, temp_dir: str, command: list[str],
            seconds: float, version: str) -> CompileResult:
    """Parse a finished nvcc run into a CompileResult in source coordinates."""
    fatal = _fatal_setup(log_text, options, version, command) if returncode != 0 else None
    if fatal is not None:
        fatal.seconds = seconds
        return fatal
    resources = parse_resources(log_text)
    messages = parse_messages(log_text)
    names = [r.mangled for r in resources] + [m.function for m in messages if m.function]
    demangled = demangle(names, nvcc) if names else {}
    placement = Placement(source=source, source_file=_temp_name(path), temp_dir=temp_dir,
                          user_dir=user_dir, display_name=os.path.basename(path) or "source.cu",
                          demangled=demangled)
    diagnostics = placement.place(messages)
    if options.torch_headers and not torch_include_paths():
        for d in diagnostics:
            if d.severity == "error" and re.search(r"\b(?:torch|ATen|c10|pybind11)/", d.message):
                d.message += ("\n(torch's C++ headers were not found: install torch in the Python "
                              "environment kernel-lsp runs in, or add its include dirs to includePaths)")
    bounds = launch_bounds_map(source) if resources else {}
    for res in resources:
        res.kernel = function_name(demangled.get(res.mangled, res.mangled))
        res.threads_per_block = bounds.get(res.kernel)
        try:
            arch_limits(res.arch)
        except ValueError:
            continue  # no occupancy table for this arch: leave occupancy unknown
        res.occupancy, res.occupancy_limiter = occupancy(res.arch, res.threads_per_block, res.registers,
                                                          res.shared_bytes)
    if returncode != 0 and not any(d.severity == "error" for d in diagnostics):
        if returncode < 0:
            what = f"nvcc was killed by signal {-returncode}"
        else:
            what = f"nvcc failed (exit {returncode})"
        tail = [l for l in log_text.strip().splitlines() if l.strip()][-3:]
        detail = ": " + " / ".join(tail) if tail else " with no message"
        diagnostics.insert(0, Diagnostic(Span(0, 0, 0, 0), "error", what + detail, source="nvcc",
                                         code="nvcc-failed"))
    return CompileResult(ok=returncode == 0, diagnostics=diagnostics, resources=resources,
                         log=log_text.replace(temp_dir + os.sep, ""), seconds=seconds, command=command)


@dataclass(frozen=True)
class Around:
    """Text the compiler sees around the user's source that the user did not write (what
    load_inline adds): diagnostics there say so and are placed at the source's edge."""

    prelude: str = ""
    postlude: str = ""
    prelude_note: str = "a line load_inline adds before your source"
    postlude_note: str = "code load_inline adds after your source"

    def lines(self) -> int:
        return self.prelude.count("\n")


def _map(result: CompileResult, line_map: LineMap | None, path: str, source: str = "",
         around: Around | None = None) -> CompileResult:
    """A copy of `result` with spans moved into the document through `line_map` (and out of
    the text added `around` the source)."""
    out = CompileResult.from_dict(result.to_dict())
    if around is not None and (around.prelude or around.postlude):
        pre = around.lines()
        body = source.count("\n") + 1
        pre_lines = around.prelude.split("\n")
        for d in out.diagnostics:
            if d.code in ("nvcc-missing", "nvcc-broken", "bad-arch", "bad-option", "nvcc-failed"):
                continue
            line = d.span.start_line
            if line < pre:
                added = pre_lines[line].strip() if line < len(pre_lines) else ""
                d.message += f" (from `{added}`, {around.prelude_note}; not a line you wrote)"
                d.span = Span(0, 0, 0, 0)
            elif line >= pre + body:
                d.message += f" ({around.postlude_note}; not a line you wrote)"
                last = body - 1
                d.span = Span(last, 0, last, 0)
            else:
                d.span = Span(line - pre, d.span.start_col, max(line - pre, d.span.end_line - pre),
                              d.span.end_col)
    if line_map is None:
        return out
    for d in out.diagnostics:
        if d.code in ("nvcc-missing", "nvcc-broken", "bad-arch", "bad-option"):
            continue  # setup problems stay at line 0 of the document
        sl, sc = line_map(d.span.start_line, d.span.start_col)
        el, ec = line_map(d.span.end_line, d.span.end_col)
        d.span = Span(sl, sc, el, ec)
        d.path = path
    return out


# ----------------------------------------------------------------- the on-save check


async def compile_check(
    source: str,
    *,
    path: str,
    options: CompileOptions,
    line_map: LineMap | None = None,
    timeout: float | None = 120.0,
    cache_dir: str | None = None,
    around: Around | None = None,
) -> CompileResult:
    """Compile `source` (the text of `path`, or CUDA embedded in it with `line_map` from
    source (line, col) to document (line, col)) to a cubin with ptxas' report. `around`:
    text compiled before/after it that the user did not write (load_inline's headers).

    Never raises for toolchain or source problems; cancelling the awaiting task kills
    nvcc and everything it started.
    """
    resolved = _resolve(options)
    if isinstance(resolved, CompileResult):
        return _map(resolved, None, path)
    nvcc, version = resolved
    user_source = source
    if around is not None:
        source = around.prelude + source + around.postlude
    options, user_dir = _with_user_dir(options, path)
    key = _cache_key("cubin", source, options.key(), nvcc, version, path,
                     _header_stamps(source, user_dir, options.include_paths))
    hit = _memory_cache.get(key)
    if hit is None and cache_dir:
        hit = _disk_get(cache_dir, key)
        if hit is not None:
            _remember(key, hit)
    if hit is not None:
        _memory_cache.move_to_end(key)
        result = _map(CompileResult.from_dict(hit), line_map, path, user_source, around)
        result.cached = True
        return result

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-nvcc-") as temp_dir:
        src_name = _temp_name(path)
        with open(os.path.join(temp_dir, src_name), "w", encoding="utf-8") as f:
            f.write(source)
        command = nvcc_command(src_name, options=options, out_path="out.cubin", mode="cubin", nvcc=nvcc)
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, cwd=temp_dir, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True)  # its own process group: cancel kills cicc/ptxas too
        except OSError as exc:
            return _setup_failure(f"cannot run nvcc at {nvcc}: {exc.strerror or exc}. Set {NVCC_SETTING} "
                                  "to a working nvcc.", "nvcc-broken", command)
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            return _setup_failure(f"nvcc took longer than {timeout:.0f} s and was stopped.",
                                  "nvcc-timeout", command)
        except BaseException:
            _kill_group(proc.pid)
            await asyncio.shield(proc.wait())
            raise
        log_text = output.decode("utf-8", "replace")
        result = _finish(source, path, options, nvcc, log_text, proc.returncode or 0, user_dir,
                         temp_dir, command, time.monotonic() - started, version)
    data = result.to_dict()
    _remember(key, data)
    if cache_dir:
        _disk_put(cache_dir, key, data)
    return _map(result, line_map, path, user_source, around)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remember(key: str, data: dict) -> None:
    _memory_cache[key] = data
    _memory_cache.move_to_end(key)
    while len(_memory_cache) > _MEMORY_CACHE_SIZE:
        _memory_cache.popitem(last=False)


def _disk_get(cache_dir: str, key: str) -> dict | None:
    try:
        with open(os.path.join(cache_dir, key[:2], key + ".json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _disk_put(cache_dir: str, key: str, data: dict) -> None:
    directory = os.path.join(cache_dir, key[:2])
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, os.path.join(directory, key + ".json"))
    except OSError as exc:  # a read-only or full disk only costs the cache
        log.debug("compile cache write failed: %s", exc)


# ----------------------------------------------------------------- the fast build


def build_library(
    source: str,
    *,
    out_path: str,
    options: CompileOptions,
    timeout: float | None = 300.0,
    path: str | None = None,
) -> CompileResult:
    """Build `source` (a .cu with an extern "C" launcher) into the shared library `out_path`
    with `nvcc -shared -Xcompiler -fPIC -O3`. Synchronous; the library appears atomically
    and only on success. `path` (the .cu's own path) places diagnostics and adds its
    directory to the include path."""
    path = path or os.path.splitext(out_path)[0] + ".cu"
    resolved = _resolve(options)
    if isinstance(resolved, CompileResult):
        return resolved
    nvcc, version = resolved
    options, user_dir = _with_user_dir(options, path)
    out_path = os.path.abspath(out_path)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-build-") as temp_dir:
        src_name = _temp_name(path)
        with open(os.path.join(temp_dir, src_name), "w", encoding="utf-8") as f:
            f.write(source)
        partial = os.path.join(temp_dir, "out.so")
        command = nvcc_command(src_name, options=options, out_path=partial, mode="shared", nvcc=nvcc)
        try:
            proc = subprocess.Popen(command, cwd=temp_dir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            return _setup_failure(f"cannot run nvcc at {nvcc}: {exc.strerror or exc}. Set {NVCC_SETTING} "
                                  "to a working nvcc.", "nvcc-broken", command)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            return _setup_failure(f"nvcc took longer than {timeout:.0f} s and was stopped.",
                                  "nvcc-timeout", command)
        except BaseException:
            _kill_group(proc.pid)
            proc.wait()
            raise
        log_text = output.decode("utf-8", "replace")
        result = _finish(source, path, options, nvcc, log_text, proc.returncode, user_dir, temp_dir,
                         command, time.monotonic() - started, version)
        if result.ok:
            if not os.path.isfile(partial):
                result.ok = False
                result.diagnostics.insert(0, Diagnostic(Span(0, 0, 0, 0), "error",
                                                        "nvcc reported success but wrote no library",
                                                        code="nvcc-failed"))
            else:
                # Copy next to the target, then rename: a loader never sees half a library.
                fd, staged = tempfile.mkstemp(dir=os.path.dirname(out_path), suffix=".so.tmp")
                os.close(fd)
                shutil.copyfile(partial, staged)
                os.chmod(staged, 0o755)
                os.replace(staged, out_path)
        result.command = [c.replace(partial, out_path) for c in command]
    return result


__all__ = ["compile_check", "build_library", "clear_cache", "LineMap", "Around"]

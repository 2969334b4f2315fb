"""Build and load Candidates, never paying twice for the same text.

- ``load_python(source, filename)`` executes a ``.py`` as a fresh module. Any
  ``torch.utils.cpp_extension.load_inline`` / ``load`` it calls is intercepted: the
  extension's name and build directory come from a content hash of its sources and
  flags, under ``cache_root()/ext``, so an unchanged extension loads from the cache in
  milliseconds, in any process, in any session.
- ``load_cuda(source, filename, options)`` builds a ``.cu``: with an ``extern "C"``
  launcher (and no PYBIND11_MODULE / TORCH_LIBRARY) through ``nvcc -shared`` into
  ``cache_root()/so/<hash>.so`` loaded with ctypes (about 1.8 s cold instead of
  about 60 s); otherwise as a torch extension with a hashed name.
- ``build_cuda`` / ``build_python`` do the same without handing back the library
  (for the CPU build pool, so the GPU Worker later gets a cache hit).
- With the fast path on, the extensions a module builds at import run at once: each
  ``load_inline`` returns a stand-in at once and builds in a thread; the module's import ends
  when every build has, and the stand-ins in its globals are swapped for the real modules
  (a candidate with two extensions took their sum, now their longest).

Two processes building the same text take turns on a file lock; outputs are
written to a temporary name and renamed, or marked done only once complete.
The interception hooks are installed once per process and stay installed, so an
extension built lazily (in ``ModelNew.__init__``) is cached too; its
CompileResult is reported only inside ``capture()``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import ctypes
import functools
import inspect
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any, Callable, Iterator

from kernel_lsp.engine.worker.build.cache import cache_root, file_lock, tool_id
from kernel_lsp.model import CompileResult, Diagnostic, Span, source_hash

DEFAULT_ARCH = "sm_90"  # the lent H200; used only when neither option, env nor device says
NVCC_TIMEOUT = 600.0

_arch: str | None = None
_captures: list[list[CompileResult]] = []
_counter = itertools.count()
_hooks_installed = False
_fast_inline: bool | None = None
# Set while load_python executes a module: its uncached extension builds go to threads.
_deferred: contextvars.ContextVar[list[_PendingExtension] | None] = contextvars.ContextVar("deferred", default=None)
_env_lock = threading.Lock()
_env_users = 0
_env_saved: str | None = None


class BuildError(RuntimeError):
    """A build failed; ``result`` holds the log and Diagnostics."""

    def __init__(self, message: str, result: CompileResult) -> None:
        super().__init__(message)
        self.result = result


# -- where things go --------------------------------------------------------


def configure(arch: str | None) -> None:
    """Set the arch builds target in this process (the Worker sets its GPU's)."""
    global _arch
    _arch = _normalize_arch(arch) if arch else None


def _normalize_arch(arch: str) -> str:
    a = arch.strip()
    if re.fullmatch(r"\d+\.\d+", a):  # "9.0" (TORCH_CUDA_ARCH_LIST style)
        a = "sm_" + a.replace(".", "")
    elif re.fullmatch(r"\d+", a):
        a = "sm_" + a
    return a


def device_arch(major: int, minor: int) -> str:
    """The arch a GPU of this capability is built for: its arch-specific target (sm_90a) where
    the configured nvcc compiles one (toolchain/nvcc.py), else the base target."""
    from kernel_lsp.toolchain.nvcc import device_arch as arch_for

    return arch_for(major, minor, _find_nvcc(None))


def target_arch(options: dict[str, Any] | None = None) -> str:
    """options["arch"], else configure(), else $KERNEL_LSP_ARCH, else an initialized
    CUDA device's capability, else DEFAULT_ARCH."""
    if options and options.get("arch"):
        return _normalize_arch(str(options["arch"]))
    if _arch:
        return _arch
    env = os.environ.get("KERNEL_LSP_ARCH")
    if env:
        return _normalize_arch(env)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                major, minor = torch.cuda.get_device_capability()
                return device_arch(major, minor)
        except Exception:  # a broken driver must not stop a build for an explicit arch
            pass
    return DEFAULT_ARCH


def configure_fast_inline(enabled: bool | None) -> None:
    """Turn the split fast path for load_inline on or off in this process (None: leave it)."""
    global _fast_inline
    if enabled is not None:
        _fast_inline = bool(enabled)


def fast_inline_enabled() -> bool:
    """configure_fast_inline(), else $KERNEL_LSP_FAST_INLINE (default on)."""
    if _fast_inline is not None:
        return _fast_inline
    return os.environ.get("KERNEL_LSP_FAST_INLINE", "1").strip().lower() not in ("0", "false", "no", "off")


def _torch_arch_list(arch: str) -> str:
    m = re.fullmatch(r"sm_(\d+)(\d)([a-z]?)", arch)
    return f"{m.group(1)}.{m.group(2)}{m.group(3)}" if m else arch


@functools.cache
def _nvcc_identity(nvcc: str) -> str:
    return tool_id(nvcc)  # the compiler is part of the cache key: an upgraded nvcc rebuilds


def _find_nvcc(options: dict[str, Any] | None) -> str:
    if options and options.get("nvcc"):
        return str(options["nvcc"])
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    for cand in (
        os.path.join(home, "bin", "nvcc") if home else "",
        shutil.which("nvcc") or "",
        # Guessed only when nothing says where CUDA is: a CUDA_HOME that holds no nvcc means
        # none here, as it does for torch's own builds.
        "" if home else "/usr/local/cuda/bin/nvcc",
    ):
        if cand and os.path.exists(cand):
            return cand
    return "nvcc"


# -- compiler output -> Diagnostics -----------------------------------------

_NVCC_RE = re.compile(
    r"^(?P<file>[^\s(][^()]*?)\((?P<line>\d+)\): (?P<sev>catastrophic error|error|warning|remark)"
    r"(?: #[\w-]+)?: (?P<msg>.*)$"
)
_GCC_RE = re.compile(
    r"^(?P<file>[^\s:][^:]*?):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<sev>fatal error|error|warning): (?P<msg>.*)$"
)


def parse_compiler_output(log: str, rename: dict[str, str] | None = None) -> list[Diagnostic]:
    """nvcc (EDG) and gcc-style messages as Diagnostics; ``rename`` maps a compiled
    file's path to the path the user knows."""
    rename = rename or {}
    out: list[Diagnostic] = []
    seen: set[tuple[str, int, str]] = set()
    for raw in log.splitlines():
        line = raw.strip()
        m = _NVCC_RE.match(line) or _GCC_RE.match(line)
        if not m:
            continue
        path = rename.get(m.group("file"), m.group("file"))
        lineno = max(int(m.group("line")) - 1, 0)
        col = max(int(m.group("col")) - 1, 0) if m.groupdict().get("col") else 0
        sev = m.group("sev")
        severity = "warning" if sev == "warning" else ("information" if sev == "remark" else "error")
        key = (path, lineno, m.group("msg"))
        if key in seen:
            continue
        seen.add(key)
        out.append(
            Diagnostic(
                span=Span(lineno, col, lineno, col + 1),
                severity=severity,
                message=m.group("msg").strip(),
                source="nvcc",
                path=path,
            )
        )
    if not out and log.strip():
        # Linker or driver failures have no file:line; still say something.
        tail = [ln for ln in log.strip().splitlines() if ln.strip()][-1]
        out.append(Diagnostic(span=Span(0, 0, 0, 1), severity="error", message=tail[:500], source="nvcc"))
    return out


# -- .cu ----------------------------------------------------------------------

_EXTERN_C = re.compile(r'extern\s+"C"')
_PYBIND = re.compile(r"\bPYBIND11_MODULE\s*\(")
_TORCH_LIBRARY = re.compile(r"\bTORCH_LIBRARY(?:_FRAGMENT|_IMPL)?\s*\(\s*(\w+)")


def has_c_launcher(source: str) -> bool:
    """The fast path applies: an extern "C" host function, and no torch bindings."""
    return bool(_EXTERN_C.search(source)) and not _PYBIND.search(source) and not _TORCH_LIBRARY.search(source)


def _cuda_flags(options: dict[str, Any] | None) -> list[str]:
    flags = list((options or {}).get("flags") or [])
    return [str(f) for f in flags]


def _so_key(source: str, filename: str, options: dict[str, Any] | None) -> tuple[str, str, str, list[str]]:
    nvcc = _find_nvcc(options)
    arch = target_arch(options)
    flags = _cuda_flags(options)
    include = os.path.dirname(os.path.abspath(filename))
    key = source_hash(source, "cu-so-v1", arch, json.dumps(flags), _nvcc_identity(nvcc), include)
    return key, nvcc, arch, flags


def build_cuda(source: str, filename: str, options: dict[str, Any] | None = None) -> tuple[str | None, CompileResult]:
    """Build a .cu without loading it: (path of the .so or extension dir, CompileResult)."""
    if has_c_launcher(source):
        return _build_so(source, filename, options)
    path, result, _ = _build_torch_cu(source, filename, options, load=False)
    return path, result


def load_cuda(source: str, filename: str, options: dict[str, Any] | None = None) -> tuple[object | None, CompileResult]:
    """Build (or find in the cache) and load a .cu: a ctypes.CDLL for an extern "C"
    launcher, a Python module (PYBIND11_MODULE) or torch.ops namespace (TORCH_LIBRARY)."""
    if has_c_launcher(source):
        path, result = _build_so(source, filename, options)
        if path is None:
            return None, result
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL), result
        except OSError as exc:
            result.ok = False
            result.log += f"\nloading {path} failed: {exc}"
            result.diagnostics.append(
                Diagnostic(Span(0, 0, 0, 1), "error", f"the built library does not load: {exc}", path=filename)
            )
            return None, result
    _, result, lib = _build_torch_cu(source, filename, options, load=True)
    return lib, result


def _build_so(source: str, filename: str, options: dict[str, Any] | None) -> tuple[str | None, CompileResult]:
    t0 = time.perf_counter()
    key, nvcc, arch, flags = _so_key(source, filename, options)
    out_dir = cache_root() / "so"
    out_dir.mkdir(parents=True, exist_ok=True)
    so_path = out_dir / f"{key}.so"
    meta = out_dir / f"{key}.json"
    if so_path.exists():  # published only by rename, so existing means complete
        return str(so_path), _cached_result(meta, t0)
    with file_lock(out_dir / f"{key}.lock"):
        if so_path.exists():  # another process finished it while we waited
            return str(so_path), _cached_result(meta, t0)
        result = _toolchain_build(source, filename, so_path, nvcc, arch, flags, options)
        if result is None:
            result = _nvcc_shared(source, filename, so_path, nvcc, arch, flags, options)
        result.seconds = time.perf_counter() - t0
        if result.ok:
            # Keep the first build's report (resources, warnings) for later cache hits.
            tmp_meta = meta.with_suffix(f".{os.getpid()}.tmp")
            tmp_meta.write_text(json.dumps(result.to_dict()))
            os.replace(tmp_meta, meta)
    return (str(so_path) if result.ok else None), result


def _cached_result(meta: Path, t0: float) -> CompileResult:
    try:
        result = CompileResult.from_dict(json.loads(meta.read_text()))
    except (OSError, ValueError, TypeError):
        result = CompileResult(ok=True)
    result.ok, result.cached = True, True
    result.seconds = time.perf_counter() - t0
    return result


def _toolchain_build(
    source: str, filename: str, so_path: Path, nvcc: str, arch: str, flags: list[str], options: dict[str, Any] | None
) -> CompileResult | None:
    """kernel_lsp.toolchain.build_library (placed diagnostics, ptxas resources) when it
    imports; None to fall back to calling nvcc here. It publishes the .so atomically."""
    try:
        from kernel_lsp.toolchain import CompileOptions, build_library  # noqa: PLC0415
    except Exception:
        return None
    include = os.path.dirname(os.path.abspath(filename))
    try:
        opts = CompileOptions(nvcc=nvcc, arch=arch, flags=flags, include_paths=[include])
    except TypeError:
        return None
    timeout = float((options or {}).get("timeout") or NVCC_TIMEOUT)
    try:
        result = build_library(source, out_path=str(so_path), options=opts, timeout=timeout, path=filename)
    except Exception as exc:  # noqa: BLE001 - a toolchain bug must not take the Worker down
        return CompileResult(ok=False, log=f"toolchain.build_library failed: {exc!r}", diagnostics=[
            Diagnostic(Span(0, 0, 0, 1), "error", f"build failed: {exc}", path=filename)])
    if result.ok and not so_path.exists():
        result.ok = False
        result.log += "\nno library was written"
    return result


def _nvcc_shared(
    source: str, filename: str, so_path: Path, nvcc: str, arch: str, flags: list[str], options: dict[str, Any] | None
) -> CompileResult:
    out_dir = so_path.parent
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmpdir:
        src = Path(tmpdir) / "candidate.cu"
        # #line makes nvcc report errors on the user's file and lines.
        src.write_text(f'#line 1 "{filename}"\n{source}', encoding="utf-8")
        tmp_out = Path(tmpdir) / "out.so"
        cmd = [
            nvcc, "-shared", "-Xcompiler", "-fPIC", "-O3", f"-arch={arch}",
            "-I", os.path.dirname(os.path.abspath(filename)), *flags, "-o", str(tmp_out), str(src),
        ]
        timeout = float((options or {}).get("timeout") or NVCC_TIMEOUT)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmpdir)
        except FileNotFoundError:
            return CompileResult(ok=False, command=cmd, log=f"{nvcc}: not found", diagnostics=[
                Diagnostic(Span(0, 0, 0, 1), "error", f"nvcc not found ({nvcc}); set CUDA_HOME or PATH", path=filename)])
        except subprocess.TimeoutExpired as exc:
            return CompileResult(ok=False, command=cmd, log=str(exc), diagnostics=[
                Diagnostic(Span(0, 0, 0, 1), "error", f"nvcc ran past {timeout:.0f} s", path=filename)])
        log = (proc.stdout or "") + (proc.stderr or "")
        log = log.replace(str(src), filename)
        if proc.returncode != 0 or not tmp_out.exists():
            diags = parse_compiler_output(log, {str(src): filename})
            return CompileResult(ok=False, diagnostics=diags, log=log, command=cmd)
        os.replace(tmp_out, so_path)  # atomic publish: a reader never sees half a library
        warnings = [d for d in parse_compiler_output(log, {str(src): filename}) if d.severity != "error"] if log.strip() else []
        return CompileResult(ok=True, diagnostics=warnings, log=log, command=cmd)


def _build_torch_cu(
    source: str, filename: str, options: dict[str, Any] | None, load: bool
) -> tuple[str | None, CompileResult, object | None]:
    """A .cu with PYBIND11_MODULE / TORCH_LIBRARY through cpp_extension.load, hashed name."""
    arch = target_arch(options)
    flags = _cuda_flags(options)
    key = source_hash(source, "cu-torch-v1", arch, json.dumps(flags), _torch_identity())
    name = f"klsp_{Path(filename).stem[:24]}_{key}"
    name = re.sub(r"\W", "_", name)
    build_dir = cache_root() / "ext" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    src = build_dir / f"{name}.cu"
    if not src.exists():
        src.write_text(f'#line 1 "{filename}"\n{source}', encoding="utf-8")
    is_module = bool(_PYBIND.search(source))
    ns = _TORCH_LIBRARY.search(source)
    note: dict[str, Any] = {"fast_path": False, "fallback_reason": "" if fast_inline_enabled() else "fast_inline is off"}

    def build() -> object:
        from torch.utils import cpp_extension  # noqa: PLC0415 - torch only when needed

        real = getattr(cpp_extension.load, "_klsp_real", cpp_extension.load)
        kwargs = {"extra_cuda_cflags": ["-O3", *flags], "build_directory": str(build_dir), "verbose": False,
                  "is_python_module": is_module}
        if fast_inline_enabled():
            # The same split build as a candidate's load() (fastbuild.build_load); the normal one
            # when it is not taken, so only the build time can change.
            bound = inspect.signature(real).bind(name, [str(src)], **kwargs)
            bound.apply_defaults()
            lib = _try_fast(dict(bound.arguments), name, build_dir, is_module, note, "load")
            note["fallback_reason"] = str(note.get("fallback_reason") or "").replace(str(src), filename)
            if lib is not None:
                return lib
        return real(name, [str(src)], **kwargs)

    try:
        lib, result = _cached_torch_build(name, build_dir, build, is_module, arch, {str(src): filename})
    except BuildError as exc:
        exc.result.fallback_reason = str(note.get("fallback_reason") or "")
        return None, exc.result, None
    _apply_note(result, note, build_dir, True)
    if not is_module and ns is not None:
        import torch  # noqa: PLC0415

        lib = getattr(torch.ops, ns.group(1))
    return str(build_dir), result, (lib if load else None)


@functools.cache
def _torch_identity() -> str:
    try:
        import torch  # noqa: PLC0415

        return f"torch-{torch.__version__}-cuda-{torch.version.cuda}-py{sys.version_info[:2]}"
    except Exception:
        return f"no-torch-py{sys.version_info[:2]}"


def _cached_torch_build(
    name: str,
    build_dir: Path,
    build: Callable[[], object],
    is_module: bool,
    arch: str,
    rename: dict[str, str] | None = None,
) -> tuple[object, CompileResult]:
    """Run a cpp_extension build once per content hash; later calls import the .so."""
    t0 = time.perf_counter()
    done = build_dir / ".kernel-lsp-done"
    so = build_dir / f"{name}.so"
    if _is_built(build_dir, name):
        lib = _import_built(name, build_dir, so, is_module)
        return lib, CompileResult(ok=True, cached=True, seconds=time.perf_counter() - t0)
    with file_lock(build_dir.parent / f"{name}.lock"):
        if _is_built(build_dir, name):
            lib = _import_built(name, build_dir, so, is_module)
            return lib, CompileResult(ok=True, cached=True, seconds=time.perf_counter() - t0)
        try:
            with _arch_env(arch):
                lib = build()
        except Exception as exc:  # torch raises RuntimeError with ninja's output
            log = str(exc)
            diags = parse_compiler_output(log, rename)
            result = CompileResult(ok=False, diagnostics=diags, log=log, seconds=time.perf_counter() - t0,
                                   command=["torch.utils.cpp_extension", name])
            raise BuildError(f"building extension {name} failed", result) from exc
        done.write_text(str(time.time()))
    return lib, CompileResult(ok=True, cached=False, seconds=time.perf_counter() - t0,
                              command=["torch.utils.cpp_extension", name])


def _is_built(build_dir: Path, name: str) -> bool:
    """A finished build of extension `name` is in `build_dir` (marked done only once complete)."""
    return (build_dir / ".kernel-lsp-done").exists() and (build_dir / f"{name}.so").exists()


@contextlib.contextmanager
def _arch_env(arch: str) -> Iterator[None]:
    """TORCH_CUDA_ARCH_LIST = the target arch while any build runs (the arch is part of the key,
    so the build must use exactly it; no GPU needed). Counted: builds may run in threads."""
    global _env_users, _env_saved
    with _env_lock:
        if _env_users == 0:
            _env_saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
        _env_users += 1
        os.environ["TORCH_CUDA_ARCH_LIST"] = _torch_arch_list(arch)
    try:
        yield
    finally:
        with _env_lock:
            _env_users -= 1
            if _env_users == 0:
                if _env_saved is None:
                    os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
                else:
                    os.environ["TORCH_CUDA_ARCH_LIST"] = _env_saved


class _PendingExtension:
    """What a deferred load_inline returns until its build is done: attribute access waits for
    the build (and raises its error); load_python swaps it for the module at the end."""

    def __init__(self, name: str, future: concurrent.futures.Future[Any], stack: traceback.StackSummary) -> None:
        self._klsp_name = name
        self._klsp_future = future
        self._klsp_stack = stack

    def _klsp_result(self) -> Any:
        return self._klsp_future.result()

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_klsp_"):
            raise AttributeError(attr)
        return getattr(self._klsp_result(), attr)

    def __repr__(self) -> str:
        return f"<extension {self._klsp_name} (building)>"


_build_threads: concurrent.futures.ThreadPoolExecutor | None = None


def _threads() -> concurrent.futures.ThreadPoolExecutor:
    global _build_threads
    if _build_threads is None:
        _build_threads = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="klsp-ext-build")
    return _build_threads


def idle_own_threads() -> set[threading.Thread]:
    """The extension-build pool's threads when the pool is idle (nothing queued, every thread
    waiting for work): the engine's, not a candidate's. While any work is queued or running they
    are not vouched for, since a candidate could hand its own work to the pool; empty then."""
    ex = _build_threads
    if ex is None:
        return set()
    threads = set(getattr(ex, "_threads", ()) or ())
    idle = getattr(ex, "_idle_semaphore", None)   # ThreadPoolExecutor's count of idle threads
    queue = getattr(ex, "_work_queue", None)
    if idle is None or queue is None or queue.qsize() or getattr(idle, "_value", -1) < len(threads):
        return set()
    return threads


def _import_built(name: str, build_dir: Path, so: Path, is_module: bool) -> object:
    import importlib.util  # noqa: PLC0415

    if not is_module:
        import torch  # noqa: PLC0415

        torch.ops.load_library(str(so))
        return str(so)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, str(so))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {so}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


# -- load_inline / load interception ------------------------------------------


@contextlib.contextmanager
def capture() -> Iterator[list[CompileResult]]:
    """Collect the CompileResults of every extension build inside the block."""
    records: list[CompileResult] = []
    _captures.append(records)
    try:
        yield records
    finally:
        # By identity: nested captures hold equal lists (list.remove would take the outer one).
        for i, held in enumerate(_captures):
            if held is records:
                del _captures[i]
                break


def _record(result: CompileResult) -> None:
    for records in _captures:
        records.append(result)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


_KEY_SKIP = {"name", "build_directory", "verbose", "keep_intermediates"}


def _key_material(bound: dict[str, Any]) -> str:
    parts: dict[str, Any] = {}
    for k, v in bound.items():
        if k in _KEY_SKIP:
            continue
        if k == "sources":  # load(): file paths; the key is their contents and their own headers'
            from kernel_lsp.engine.worker.build.fastbuild import _as_list, local_headers  # noqa: PLC0415

            paths = [v] if isinstance(v, (str, os.PathLike)) else list(v)
            dirs = [os.path.abspath(d) for d in _as_list(bound.get("extra_include_paths"))]
            v = []
            for p in paths:
                text = Path(p).read_text(errors="replace") if os.path.exists(p) else ""
                entry: list[Any] = [str(p), text]
                heads = local_headers(Path(os.path.abspath(p)), text, dirs) if text else []
                if heads:  # an edited "ops.h" is a new extension, not a stale cache hit
                    entry.append([[str(h), _read(h)] for h in heads])
                v.append(entry)
        parts[k] = v
    return json.dumps(parts, sort_keys=True, default=str)


_FAST_NOTE = ".kernel-lsp-fast.json"


def _try_fast(a: dict[str, Any], name: str, build_dir: Path, is_module: bool, note: dict[str, Any],
              kind: str = "inline") -> object | None:
    """The split fast path (engine/worker/build/fastbuild.py) for load_inline (``kind`` "inline") or load();
    None, with note["fallback_reason"], when not taken."""
    try:
        from kernel_lsp.engine.worker.build import fastbuild  # noqa: PLC0415

        fast = fastbuild.build_inline if kind == "inline" else fastbuild.build_load
        fb = fast(a, _find_nvcc(None))
    except Exception as exc:  # noqa: BLE001 - a fast-path bug must only cost the fast path
        note["fallback_reason"] = f"fast path raised {type(exc).__name__}: {exc}"[:500]
        return None
    note["steps"] = {k: round(v, 3) for k, v in fb.steps.items()}
    if fb.full_header:
        note["full_header"] = list(fb.full_header)
    if fb.full_prelude:
        note["full_prelude"] = list(fb.full_prelude)
    if fb.binding:
        note["binding"] = fb.binding
    if fb.so:
        t0 = time.perf_counter()
        try:
            try:
                lib = _import_built(name, build_dir, Path(fb.so), is_module)
            except (ImportError, OSError) as exc:  # OSError: torch.ops.load_library's dlopen
                # Linked against libtorch_python alone (fastbuild.lean_ldflags) and a symbol was not
                # found: linked again with torch's whole list, then loaded once more.
                if not fb.lean:
                    raise
                why = fastbuild.relink_full(fb)
                if why:
                    raise ImportError(f"{exc}; linked again with torch's whole list: {why}") from exc
                note["lean_link_failed"] = str(exc)[:300]
                lib = _import_built(name, build_dir, Path(fb.so), is_module)
        except Exception as exc:  # noqa: BLE001 - e.g. an undefined symbol: build it the normal way
            said = str(exc).replace(f"{fb.so}: ", "")  # the cache's path says nothing to the user
            note["fallback_reason"] = f"the fast build does not load: {said}"[:500]
            with contextlib.suppress(OSError):
                os.unlink(fb.so)
            return None
        note["fast_path"] = True
        note["steps"]["load"] = round(time.perf_counter() - t0, 3)
        return lib
    note["fallback_reason"] = fb.reason
    return None


def _wrap(real: Callable[..., Any], kind: str) -> Callable[..., Any]:
    sig = inspect.signature(real)

    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        with_cuda = bool(a.get("cuda_sources")) or bool(a.get("with_cuda")) or any(
            str(s).endswith(".cu") for s in ([a["sources"]] if isinstance(a.get("sources"), str) else a.get("sources") or [])
        )
        arch = target_arch() if with_cuda else "cpu"
        key = source_hash(_key_material(a), f"{kind}-v1", arch, _torch_identity())
        name = re.sub(r"\W", "_", f"{str(a['name'])[:40]}_{key}")
        build_dir = cache_root() / "ext" / name
        build_dir.mkdir(parents=True, exist_ok=True)
        is_module = bool(a.get("is_python_module", True))
        a["name"] = name
        a["build_directory"] = str(build_dir)
        a["verbose"] = False
        note: dict[str, Any] = {"fast_path": False, "fallback_reason": ""}
        if with_cuda and not fast_inline_enabled():
            note["fallback_reason"] = "fast_inline is off"

        def build() -> object:
            if with_cuda and fast_inline_enabled():
                lib = _try_fast(a, name, build_dir, is_module, note, kind)
                if lib is not None:
                    return lib
            return real(**a)

        def run() -> object:
            try:
                lib, result = _cached_torch_build(name, build_dir, build, is_module, arch)
            except BuildError as exc:
                exc.result.fallback_reason = str(note.get("fallback_reason") or "")
                _record(exc.result)
                raise
            return _finish(lib, result, note, build_dir, with_cuda)

        pending = _deferred.get()
        # load() is not deferred: torch's normal build (the fallback) reads the user's files and
        # the headers they include only when it runs, and a candidate may remove them as soon as
        # load() returns (sources written to a temporary folder are common).
        if pending is not None and is_module and kind == "inline" and not _is_built(build_dir, name):
            ext = _PendingExtension(name, _threads().submit(run), traceback.extract_stack()[:-1])
            pending.append(ext)
            return ext
        return run()

    wrapper._klsp_real = real  # type: ignore[attr-defined]
    return wrapper


def _apply_note(result: CompileResult, note: dict[str, Any], build_dir: Path, with_cuda: bool) -> None:
    """Say in a done build's result what the fast path did (kept beside the build, so that a
    cache hit says it too)."""
    if result.cached:
        with contextlib.suppress(OSError, ValueError):
            note = json.loads((build_dir / _FAST_NOTE).read_text())
    elif with_cuda:
        with contextlib.suppress(OSError):
            (build_dir / _FAST_NOTE).write_text(json.dumps(note))
    result.fast_path = bool(note.get("fast_path"))
    result.fallback_reason = str(note.get("fallback_reason") or "")
    if not result.cached:  # a cache hit built nothing: no steps to tell
        result.steps = {str(k): float(v) for k, v in (note.get("steps") or {}).items()}


def _finish(lib: object, result: CompileResult, note: dict[str, Any], build_dir: Path, with_cuda: bool) -> object:
    """Record a done build with what the fast path did."""
    _apply_note(result, note, build_dir, with_cuda)
    _record(result)
    return lib


def _patch(cpp_extension: types.ModuleType) -> None:
    for attr, kind in (("load_inline", "inline"), ("load", "load")):
        real = getattr(cpp_extension, attr, None)
        if real is not None and not hasattr(real, "_klsp_real"):
            setattr(cpp_extension, attr, _wrap(real, kind))


class _PatchOnImport:
    """A meta-path finder that patches torch.utils.cpp_extension as it is first
    imported, so a candidate that never uses it does not pay for importing torch."""

    TARGET = "torch.utils.cpp_extension"

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                real_exec = spec.loader.exec_module

                def exec_module(module: types.ModuleType) -> None:
                    real_exec(module)
                    _patch(module)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def install_hooks() -> bool:
    """Route cpp_extension.load_inline / load through the content-hash cache, now if
    torch.utils.cpp_extension is imported, else as soon as it is. Idempotent."""
    global _hooks_installed
    module = sys.modules.get(_PatchOnImport.TARGET)
    if module is not None:
        _patch(module)
    if not _hooks_installed:
        if module is None:
            sys.meta_path.insert(0, _PatchOnImport())
        _hooks_installed = True
    return True


# -- .py ----------------------------------------------------------------------


def _merge(records: list[CompileResult], seconds: float, ok: bool = True) -> CompileResult:
    return CompileResult(
        ok=ok and all(r.ok for r in records),
        diagnostics=[d for r in records for d in r.diagnostics],
        resources=[u for r in records for u in r.resources],
        log="\n".join(r.log for r in records if r.log),
        seconds=seconds,
        cached=bool(records) and all(r.cached for r in records),
        command=records[-1].command if records else [],
        fast_path=bool(records) and all(r.fast_path for r in records),
        fallback_reason="; ".join(r.fallback_reason for r in records if r.fallback_reason),
        steps=_sum_steps(records),
    )


def _sum_steps(records: list[CompileResult]) -> dict[str, float]:
    # Several extensions build at once: their steps side by side, summed per step.
    out: dict[str, float] = {}
    for r in records:
        for k, v in r.steps.items():
            out[k] = round(out.get(k, 0.0) + v, 3)
    return out


def _python_diagnostic(exc: BaseException, filename: str) -> Diagnostic:
    line = max(int(getattr(exc, "_klsp_line", 0) or 0) - 1, 0)  # a deferred build: where it was asked for
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == filename and frame.lineno:
            line = frame.lineno - 1  # deepest frame in the candidate's own file
    return Diagnostic(
        span=Span(line, 0, line, 1),
        severity="error",
        message=f"{type(exc).__name__}: {exc}"[:2000],
        source="python",
        path=filename,
    )


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or type(exc).__name__.endswith("OutOfMemoryError")


def _resolve(module: types.ModuleType, pending: list[_PendingExtension], filename: str) -> None:
    """After the module ran: raise the first failed deferred build (from the line that asked for
    it), else put the built modules where the stand-ins are in the module's globals."""
    for ext in pending:
        exc = ext._klsp_future.exception()
        if exc is not None:
            frames = [f for f in ext._klsp_stack if f.filename == filename]
            if frames:  # the diagnostic goes on the load_inline line, as for a build at that line
                exc._klsp_line = frames[-1].lineno  # type: ignore[attr-defined]
            raise exc
    for key, value in list(module.__dict__.items()):
        if isinstance(value, _PendingExtension):
            module.__dict__[key] = value._klsp_result()


def load_python(source: str, filename: str) -> tuple[types.ModuleType | None, CompileResult]:
    """Execute a candidate or reference file as a new module (unique name in
    sys.modules). A syntax error, an exception at import or a failed extension build
    comes back as CompileResult(ok=False) with Diagnostics. Out-of-memory errors
    propagate (they are a verdict of their own, not a compile error)."""
    install_hooks()
    t0 = time.perf_counter()
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as exc:
        line = max((exc.lineno or 1) - 1, 0)
        col = max((exc.offset or 1) - 1, 0)
        diag = Diagnostic(Span(line, col, line, col + 1), "error", f"SyntaxError: {exc.msg}", source="python",
                          path=filename)
        return None, CompileResult(ok=False, diagnostics=[diag], log=str(exc), seconds=time.perf_counter() - t0)
    name = f"kernel_lsp_candidate_{source_hash(source, filename)}_{next(_counter)}"
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # dataclasses, pickling and typing look the module up
    pending: list[_PendingExtension] = []
    token = _deferred.set(pending if fast_inline_enabled() else None)
    with capture() as records:
        try:
            try:
                exec(code, module.__dict__)
            finally:
                _deferred.reset(token)
                concurrent.futures.wait([p._klsp_future for p in pending])
            _resolve(module, pending, filename)
        except BuildError as exc:
            sys.modules.pop(name, None)
            result = _merge(records, time.perf_counter() - t0, ok=False)
            if not result.diagnostics:
                result.diagnostics = list(exc.result.diagnostics)
            # Also mark the line in the .py that asked for the build.
            call = _python_diagnostic(exc, filename)
            errors = sum(d.severity == "error" for d in result.diagnostics)
            call.message = f"the extension build failed ({errors} error{'s' * (errors != 1)} in the compiler log)"
            result.diagnostics.append(call)
            return None, result
        except (Exception, SystemExit) as exc:
            if _is_oom(exc):
                sys.modules.pop(name, None)
                raise
            sys.modules.pop(name, None)
            result = _merge(records, time.perf_counter() - t0, ok=False)
            result.diagnostics.append(_python_diagnostic(exc, filename))
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            result.log = (result.log + "\n" + tb).strip()
            return None, result
    return module, _merge(records, time.perf_counter() - t0)


def build_python(source: str, filename: str) -> CompileResult:
    """Execute a .py only for its extension builds (the CPU pool's prebuild)."""
    module, result = load_python(source, filename)
    if module is not None:
        sys.modules.pop(module.__name__, None)
    return result

"""The fast build of a ``load_inline`` or ``load`` CUDA extension (torch, no tree-sitter).

``inline_split.split`` cuts the CUDA source into a device unit (kernels and generated launchers,
light CUDA headers) and a host unit (the torch-facing code). Here:

- nvcc builds the device unit (about a second: it never parses torch's headers);
- the host compiler builds the host unit and load_inline's generated ``main.cpp`` (the same text
  load_inline writes: ``cpp_sources`` plus the pybind module for ``functions=``) against a
  precompiled torch header, made once per torch version + compiler + flags and kept under
  ``pch_root()``;
- the three run at once, then link like torch does (the same libraries, from torch's own
  helpers) into ``<build_directory>/<name>.so``, the extension torch would have built.

``load()`` of source files takes the same path (``build_load``): each ``.cu`` split the same
way, each ``.cpp`` a host unit like ``main.cpp``; both builds are a list of ``Unit``s for
``_build_units``.

Every step that cannot be taken says why (``FastBuild.reason``); the caller then builds the
normal way, so a fast-path problem never changes a verdict or a diagnostic.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kernel_lsp.engine.worker.build import binding as bindings
from kernel_lsp.engine.worker.build import inline_split, table_binding, unit_cache
from kernel_lsp.engine.worker.build.cache import cache_root, file_lock, tool_id

PCH_HEADER = """#include <torch/extension.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#if __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#if __has_include(<cublas_v2.h>) && __has_include(<cusparse.h>) && __has_include(<cusolverDn.h>)
#include <ATen/cuda/CUDAContext.h>
#endif
#endif
"""
PCH_MINIMAL = "#include <torch/extension.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
# The units are first built against light headers: the full torch/extension.h (the C++ frontend,
# pybind) costs about 7 s of template instantiation in every unit that includes it, even from a
# precompiled header (g++ instantiates at the end of each unit). Host code uses the tensor API and
# CUDA's; main.cpp the pybind glue. A unit that needs more is built again against the full header.
LIGHT_HOST = """#include <torch/types.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#if __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#if __has_include(<cublas_v2.h>) && __has_include(<cusparse.h>) && __has_include(<cusolverDn.h>)
#include <ATen/cuda/CUDAContext.h>
#endif
#endif
"""
LIGHT_MAIN = """#include <torch/types.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/autograd/python_variable.h>
"""
LIGHT_HEADERS = {"host": LIGHT_HOST, "main": LIGHT_MAIN}  # what every fast build's host units need
# Includes that pull in the whole frontend; blanked (line numbers kept) for the light build.
_HEAVY_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/(?:extension|torch|all|python)\.h[>"][^\n]*$', re.M)
HOST_OPT = "-O1"      # the host units are torch glue; the PCH is made with the same level
STEP_TIMEOUT = 600.0


@dataclass
class FastBuild:
    so: str | None = None
    reason: str = ""                       # why the fast path was not taken ("" when it was)
    seconds: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)
    log: str = ""
    commands: list[list[str]] = field(default_factory=list)
    full_header: list[str] = field(default_factory=list)  # units that needed torch/extension.h in full
    full_prelude: list[str] = field(default_factory=list)  # device units the light prelude did not build
    compiled: list[str] = field(default_factory=list)     # steps a compiler ran for in this build
    reused: list[str] = field(default_factory=list)       # steps whose object came from the unit cache
    linker: str = ""                       # what linked it: "gold", "lld", "default" (+ why not the faster one)
    lean: bool = False                     # linked against libtorch_python alone (lean_ldflags); relink_full undoes it
    full_link: list[str] = field(default_factory=list)  # the link command with torch's whole list
    binding: str = ""                      # main.cpp: "by table", "by signature (...)", else why load_inline's text
    binding_failed: bool = False           # the failure is the signature binding's: built again without it


def pch_root() -> Path:
    """$KERNEL_LSP_PCH_CACHE, else <build cache>/pch: one precompiled header per torch build."""
    env = os.environ.get("KERNEL_LSP_PCH_CACHE")
    if env:
        return Path(env)
    return cache_root() / "pch"


# -- what torch would use ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchFlags:
    cxx: str
    nvcc: str
    std: str
    includes: tuple[str, ...]        # -isystem dirs: torch, CUDA, Python
    defines: tuple[str, ...]         # torch's common defines (pybind ABI, extension API)
    nvcc_common: tuple[str, ...]     # COMMON_NVCC_FLAGS
    ldflags: tuple[str, ...]
    identity: str                    # torch version + compilers + flags, for the PCH key


def _std_flag() -> str:
    """The C++ standard torch's own JIT build passes (read from torch, not assumed)."""
    from torch.utils import cpp_extension  # noqa: PLC0415

    try:
        text = inspect.getsource(cpp_extension._write_ninja_file_to_build_library)
        found = re.findall(r"-std=(c\+\+\d+)", text)
        if found:
            return f"-std={found[-1]}"
    except (OSError, TypeError, AttributeError):
        pass
    return "-std=c++17"


def _cuda_home(nvcc: str) -> str:
    from torch.utils import cpp_extension  # noqa: PLC0415

    real = shutil.which(nvcc) or nvcc
    beside = str(Path(os.path.realpath(real)).parent.parent)
    # The first that really holds CUDA's headers: an `nvcc` on PATH may be a wrapper script
    # (/usr/local/bin/nvcc), which makes torch guess /usr/local as CUDA_HOME.
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                 getattr(cpp_extension, "CUDA_HOME", None), beside, "/usr/local/cuda"):
        if home and os.path.exists(os.path.join(str(home), "include", "cuda.h")):
            return str(home)
    return beside


@functools.cache
def torch_flags(nvcc: str) -> TorchFlags:
    import torch  # noqa: PLC0415
    from torch.utils import cpp_extension as ce  # noqa: PLC0415

    cuda_home = _cuda_home(nvcc)
    try:
        includes = list(ce.include_paths("cuda"))
    except (OSError, TypeError):  # a CPU build of torch has no CUDA_HOME of its own
        includes = list(ce.include_paths()) + [os.path.join(cuda_home, "include")]
    cuda_inc = os.path.join(cuda_home, "include")
    if cuda_inc not in includes:
        includes.append(cuda_inc)
    py_inc = sysconfig.get_path("include", scheme="posix_prefix")
    if py_inc:
        includes.append(py_inc)
    defines = ["-DTORCH_API_INCLUDE_EXTENSION_H"]
    for helper in ("_get_pybind11_abi_build_flags", "_get_glibcxx_abi_build_flags"):
        fn = getattr(ce, helper, None)
        if callable(fn):
            import warnings  # noqa: PLC0415

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # Written for a shell (ninja): -DPYBIND11_COMPILER_TYPE=\"_gcc\" -> ="_gcc" here.
                defines += [x for f in fn() for x in shlex.split(str(f))]
    ldflags: list[str] = []
    prep = getattr(ce, "_prepare_ldflags", None)
    try:
        if prep is None:
            raise TypeError("no _prepare_ldflags")
        params = inspect.signature(prep).parameters
        kw = {"extra_ldflags": [], "with_cuda": True, "with_sycl": False, "verbose": False, "is_standalone": False}
        ldflags = list(prep(**{k: v for k, v in kw.items() if k in params}))
    except (OSError, TypeError):
        lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        ldflags = [f"-L{lib}", "-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch_cuda", "-ltorch", "-ltorch_python",
                   f"-L{os.path.join(cuda_home, 'lib64')}", "-lcudart"]
    cxx = "c++"
    with contextlib.suppress(Exception):
        cxx = str(ce.get_cxx_compiler())
    std = _std_flag()
    common = [str(f) for f in getattr(ce, "COMMON_NVCC_FLAGS", [])]
    ident = json.dumps([torch.__version__, str(torch.version.cuda), tool_id(cxx), std, defines, common, includes,
                        HOST_OPT, PCH_HEADER, sys.version_info[:2]])
    return TorchFlags(cxx, nvcc, std, tuple(includes), tuple(defines), tuple(common), tuple(ldflags), ident)


def _host_defines(flags: TorchFlags) -> list[str]:
    # The host code of a .cu was compiled with nvcc's -D flags: keep them for the host unit.
    return [*flags.defines, *(f for f in flags.nvcc_common if f.startswith("-D"))]


def _host_base(flags: TorchFlags) -> list[str]:
    inc = [x for d in flags.includes for x in ("-isystem", d)]
    return [flags.std, "-fPIC", HOST_OPT, *_host_defines(flags), *inc]


MADE = "made.json"


def pch_dir(flags: TorchFlags, header_text: str) -> Path:
    """The folder of one precompiled header: per torch build, compiler, flags and header text."""
    return pch_root() / hashlib.sha256((flags.identity + header_text).encode()).hexdigest()[:20]


def ensure_pch(flags: TorchFlags, timeout: float = STEP_TIMEOUT,
               headers: tuple[str, ...] = (PCH_HEADER, PCH_MINIMAL),
               steps: dict[str, float] | None = None) -> tuple[Path | None, str, float]:
    """(header to -include, why not, seconds spent building it now). Built once, under a lock;
    ``headers``: the texts to try, in order (the full torch header by default). ``steps``: a
    build's steps, where the seconds it waited for another process making the same header go
    (``pch_wait``, the longest such wait: a build's headers are made side by side). On a fresh
    machine that wait was most of a first build: 35.5 s in the pool, 6.5 s of it compiling."""
    d = pch_dir(flags, headers[0])
    header = d / "klsp_torch.h"
    gch = d / "klsp_torch.h.gch"
    failed = d / "failed.txt"
    if gch.exists():
        return header, "", 0.0
    if failed.exists():
        return None, failed.read_text()[:300], 0.0
    t0 = time.perf_counter()
    with file_lock(d / ".lock"):
        if gch.exists():  # another process made it while this one waited
            waited = time.perf_counter() - t0
            if steps is not None and waited >= 0.01:
                steps["pch_wait"] = max(steps.get("pch_wait", 0.0), round(waited, 3))
            return header, "", 0.0
        tmp = d / f"klsp_torch.h.gch.{os.getpid()}.tmp"
        why = ""
        # torch's CUDA headers if this install has what they include, else torch/extension.h alone
        for text in headers:
            header.write_text(text)
            cmd = [flags.cxx, "-x", "c++-header", *_host_base(flags), str(header), "-o", str(tmp)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return None, f"precompiled torch header: {exc}", time.perf_counter() - t0
            if proc.returncode == 0:
                break
            why = "precompiled torch header failed: " + _first_error(proc.stderr)
        else:
            failed.write_text(why)
            return None, why, time.perf_counter() - t0
        os.replace(tmp, gch)
        spent = time.perf_counter() - t0
        # Who made it (a background preparation, or a build that could not wait): for the record.
        with contextlib.suppress(OSError):
            (d / MADE).write_text(json.dumps({"pid": os.getpid(), "seconds": round(spent, 2), "at": time.time()}))
    return header, "", spent


def light_text(text: str) -> str:
    """The unit without the includes of the whole torch frontend (lines kept for diagnostics)."""
    return _HEAVY_INCLUDE.sub("", text)


# -- load_inline's main.cpp ---------------------------------------------------------------------------


def main_cpp(args: dict[str, Any]) -> str:
    """The text load_inline writes to main.cpp (its documented behaviour, rebuilt here)."""
    cpp = args.get("cpp_sources") or []
    parts = [cpp] if isinstance(cpp, str) else list(cpp)
    if not args.get("no_implicit_headers"):
        parts.insert(0, "#include <torch/extension.h>")
    functions = args.get("functions")
    if functions is not None:
        if isinstance(functions, str):
            functions = [functions]
        if isinstance(functions, list):
            functions = {f: f for f in functions}
        defs = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
        for fname, doc in dict(functions).items():
            wrapped = f"torch::wrap_pybind_function({fname})" if args.get("with_pytorch_error_handling", True) else fname
            defs.append(f'm.def("{fname}", {wrapped}, "{doc}");')
        defs.append("}")
        parts += defs
    return "\n".join(parts)


# -- flags from the user's extra_* ----------------------------------------------------------------------


def _as_list(v: Any) -> list[str]:
    if not v:
        return []
    # torch writes flags into a ninja file, where an empty one vanishes; here it would be an argument
    items = [v] if isinstance(v, str) else list(v)
    return [str(x).strip() for x in items if str(x).strip()]


def _pch_safe(flags: list[str]) -> list[str]:
    """Drop -O levels: g++ 12 crashes (internal compiler error) reading a PCH made at another
    level, and the host units are glue whose behaviour does not depend on it."""
    return [f for f in flags if not re.fullmatch(r"-O[0-3sgz]?|-Ofast", f)]


def host_flags_from_cuda(extra_cuda: list[str]) -> list[str]:
    """What of extra_cuda_cflags applied to the .cu's host code: -D/-U/-I and -Xcompiler's."""
    out: list[str] = []
    it = iter(extra_cuda)
    for f in it:
        if f in ("-Xcompiler", "--compiler-options"):
            nxt = next(it, "")
            out += [x for x in nxt.strip("'\"").split(",") if x]
        elif f.startswith(("-Xcompiler=", "--compiler-options=")):
            out += [x for x in f.split("=", 1)[1].strip("'\"").split(",") if x]
        elif f.startswith(("-D", "-U", "-I")) and len(f) > 2:
            out.append(f)
    return out


# -- the build ----------------------------------------------------------------------------------------


_ERROR_LINE = re.compile(r"(?:^|[\s:)])(?:fatal |catastrophic )?error(?: #[\w-]+)?:", re.I)


def _write_if_changed(path: Path, text: str) -> None:
    try:
        if not path.is_file() or path.read_text() != text:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
    except OSError:  # a read-only cache: the message keeps the short name
        pass


def _in_folder(error: str, build_dir: Path) -> str:
    """The error line with its file named by full path: units compile in their build folder under
    short names (cuda.cu, main.cpp), and whoever maps the error back to the candidate's own line
    (build_failure.candidate_line) reads that file."""
    m = re.match(r"([^\s:()]+)([:(])", error)
    if m and not os.path.isabs(m.group(1)) and (build_dir / m.group(1)).is_file():
        return str(build_dir / m.group(1)) + error[len(m.group(1)):]
    return error


def _first_error(log: str) -> str:
    # The compiler's own error line ("f.cpp:4:12: error: ...", "f.cu(4): error: ..."), not the
    # context before it ("In function ...") nor a path that happens to hold the word.
    for line in log.splitlines():
        if _ERROR_LINE.search(line):
            return line.strip()[:300]
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    lines = [ln for ln in log.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


@dataclass
class Unit:
    """One translation unit of a fast build."""

    step: str                  # its step and file name: fast_<step>.cu / .cpp -> fast_<step>.o
    kind: str                  # device (nvcc), host (g++, light host header), main (g++, light main header)
    text: str                  # as compiled against the full header; the light build blanks heavy includes
    flags: list[str] = field(default_factory=list)       # the user's flags that reach this unit
    quote_dirs: list[str] = field(default_factory=list)  # where its user file's "x.h" includes resolve
    label: str = ""            # how a failure names it ("device unit", 'unit of "ops.cpp"')
    full_text: str = ""        # device: the text with the full prelude, if `text` has the light one

    def what(self) -> str:
        return self.label or f"{self.step} unit"


def _prepare(args: dict[str, Any], nvcc: str, kinds: set[str], res: FastBuild,
             timeout: float) -> tuple[TorchFlags | None, dict[str, tuple[Path | None, str, float]], str]:
    """torch's flags and the light precompiled headers the units need (made at once the first time)."""
    try:
        flags = torch_flags(nvcc)
    except Exception as exc:  # noqa: BLE001 - any surprise in torch's helpers means: the normal way
        return None, {}, f"torch's build flags: {exc}"
    wanted = [k for k in ("host", "main") if k in kinds]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        light = dict(zip(wanted, pool.map(lambda k: ensure_pch(flags, timeout, (LIGHT_HEADERS[k],), res.steps),
                                            wanted)))
    for kind, (_, _, secs) in light.items():
        if secs:
            res.steps[f"pch_{kind}"] = secs
    return flags, light, ""


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _unit_cmd(flags: TorchFlags, u: Unit, pch: Path, full: bool, build_dir: Path, includes: list[str]) -> list[str]:
    """The g++ command of a host or main unit (its text written into build_dir)."""
    src = f"fast_{u.step}{'_full' if full else ''}.cpp"
    (build_dir / src).write_text(u.text if full else light_text(u.text))
    return [flags.cxx, "-c", "-Winvalid-pch", "-include", str(pch), *_host_base(flags), *includes,
            *u.flags, src, "-o", f"fast_{u.step}.o"]


def _build_units(units: list[Unit], args: dict[str, Any], nvcc: str, res: FastBuild, done: Callable[..., FastBuild],
                 link: bool, timeout: float, binding: bindings.Binding | None = None,
                 table: list[tuple[str, str]] | None = None) -> FastBuild:
    """Compile ``units`` at once (a host unit that the light header does not serve: again against
    the full one), then link them into ``<build_directory>/<name>.so``. ``binding``: the "main"
    unit binds by signature (binding.py), or by table with ``table``'s codes (table_binding.py);
    its C object (and by signature, the placeholders' aliases) join the link, and a failure of
    its own sets ``binding_failed``."""
    name = str(args["name"])
    build_dir = Path(str(args["build_directory"]))
    flags, light, why = _prepare(args, nvcc, {u.kind for u in units}, res, timeout)
    if flags is None:
        return done(why)
    extra_cuda = _as_list(args.get("extra_cuda_cflags"))
    user_inc = [f"-I{os.path.abspath(p)}" for p in _as_list(args.get("extra_include_paths"))]
    from torch.utils import cpp_extension as ce  # noqa: PLC0415

    try:
        arch_flags = list(ce._get_cuda_arch_flags(extra_cuda))
    except Exception as exc:  # noqa: BLE001
        return done(f"torch's CUDA arch flags: {exc}")
    dev_inc = [x for d in flags.includes for x in ("-isystem", d)]

    def quote(u: Unit) -> list[str]:
        return [x for d in u.quote_dirs for x in ("-iquote", d)]

    def unit_cmd(u: Unit, pch: Path, full: bool) -> list[str]:
        return _unit_cmd(flags, u, pch, full, build_dir, [*quote(u), *user_inc])

    def device_cmd(u: Unit) -> list[str]:
        (build_dir / f"fast_{u.step}.cu").write_text(u.text)
        # No -iquote (nvcc has none): the split refuses a .cu with a "local" include anyway.
        return [nvcc, "-c", *(d for d in flags.defines if '"' not in d), *flags.nvcc_common, *arch_flags,
                "--compiler-options", "-fPIC", flags.std, *dev_inc, *user_inc, *u.flags,
                f"fast_{u.step}.cu", "-o", f"fast_{u.step}.o"]

    def full_header() -> tuple[Path | None, str]:
        pch, why, secs = ensure_pch(flags, timeout, steps=res.steps)  # made once, by the first unit that needs it
        if secs:
            res.steps["pch"] = secs
        return pch, why

    def context(u: Unit) -> unit_cache.UnitContext:
        # The user's headers this unit includes are part of its object's key.
        dirs = [*u.quote_dirs, *(f[2:] for f in (*user_inc, *u.flags) if f.startswith("-I") and len(f) > 2)]
        here = Path(u.quote_dirs[0] if u.quote_dirs else build_dir) / "unit"
        heads: list[tuple[str, str]] = []
        uses_name = False
        for h in local_headers(here, u.text, dirs):
            data = _read_bytes(h)
            heads.append((str(h), hashlib.sha256(data).hexdigest()))
            uses_name |= b"TORCH_EXTENSION_NAME" in data
        return unit_cache.UnitContext(name, tuple(heads), uses_name)

    unit_ctx = {u.step: context(u) for u in units}
    names: Any = ""
    if binding is not None:
        c_text = table_binding.table_c(binding, table) if table else binding.names_c()
        names = bindings.start_names_object(c_text, flags.cxx, build_dir)
    if not isinstance(names, str):
        finished = done

        def done(reason: str = "") -> FastBuild:  # the names' cc is waited for on every way out
            bindings.finish_names_object(names, timeout)
            return finished(reason)

    def compile_units(jobs: dict[str, list[str]]) -> dict[str, tuple[int, str, float]]:
        return unit_cache.compile_all(jobs, build_dir, timeout, res, flags.identity, unit_ctx, flags.includes)

    full_pch: Path | None = None
    hosts = [u for u in units if u.kind != "device"]
    full_now = [u.step for u in hosts if light[u.kind][0] is None]  # no light header here: the full one
    if full_now:
        full_pch, why = full_header()
        if full_pch is None:
            return done(why)
    jobs = {u.step: device_cmd(u) for u in units if u.kind == "device"}
    for u in hosts:
        pch = light[u.kind][0]
        jobs[u.step] = unit_cmd(u, pch or full_pch, pch is None)  # type: ignore[arg-type]
    res.commands = list(jobs.values())
    results = compile_units(jobs)
    for step, (rc, text, secs) in results.items():
        res.steps[step] = secs
        if text.strip() and rc == 0:
            res.log += f"[{step}]\n{text}\n"
    light_failed = [u for u in units if u.kind == "device" and u.full_text and results[u.step][0] != 0
                    and _full_prelude_may_help(results[u.step][1], nvcc)]
    if light_failed:
        # A device unit built with the light prelude (inline_split.device_prelude) that names
        # something only the full one declares: the same unit with the full one. Any other
        # error is the code's own and is reported at once (no second compile).
        swapped = {u.step: dataclasses.replace(u, text=u.full_text, full_text="") for u in light_failed}
        retry = compile_units({step: device_cmd(u) for step, u in swapped.items()})
        for step, got in retry.items():
            res.steps[f"{step}_full_prelude"] = got[2]
            results[step] = got
        res.full_prelude = sorted(swapped)
    again = [u for u in hosts if u.step not in full_now and results[u.step][0] != 0]
    if again and all(results[u.step][0] == 0 for u in units if u.kind == "device"):
        # Code that uses more of torch than the light header has: the same unit, the full header.
        full_pch, why = full_header()
        if full_pch is None:
            return done(why)
        retry = compile_units({u.step: unit_cmd(u, full_pch, True) for u in again})
        for step, (rc, text, secs) in retry.items():
            res.steps[f"{step}_full"] = secs
            results[step] = (rc, text, secs)
        res.full_header += [u.step for u in again]
    res.full_header += full_now
    for u in units:
        rc, text, _ = results.get(u.step, (1, "not run", 0.0))
        if rc != 0:
            res.log += f"[{u.step}]\n{text}\n"
            res.binding_failed = binding is not None and u.step == "main"
            return done(f"fast {u.what()} failed to compile: {_in_folder(_first_error(text), build_dir)}")
    if not link:
        return done()
    so = build_dir / f"{name}.so"
    tmp = build_dir / f"{name}.so.{os.getpid()}.tmp"
    objects = [f"fast_{u.step}.o" for u in reversed(units)]
    extra = _as_list(args.get("extra_ldflags"))
    if binding is not None:
        t1 = time.perf_counter()
        # By table, the C object names the functions itself: no aliases.
        if table:
            aliases = table_binding.not_defined(binding, table, [build_dir / o for o in objects]) or []
        else:
            aliases = bindings.placeholders(build_dir / "fast_main.o")
        if isinstance(aliases, dict):
            aliases = bindings.link_flags(binding, aliases)
        why = aliases if isinstance(aliases, str) else bindings.finish_names_object(names, timeout)
        if why:
            res.binding_failed = True
            return done(f"the {'table' if table else 'signature'} binding: {why}")
        objects.append("fast_bind_names.o")
        extra = [*aliases, *extra]
        res.steps["binding"] = time.perf_counter() - t1
    full = [flags.cxx, "-shared", *objects, *flags.ldflags, *extra, "-o", str(tmp)]
    lean = lean_ldflags(flags.ldflags)
    base = [flags.cxx, "-shared", *objects, *lean, *extra, "-o", str(tmp)] if lean is not None else full
    res.lean = lean is not None
    res.full_link = [*full[:-1], str(so)]
    linker = fast_linker(flags.cxx, flags.identity)
    cmd = [*base[:2], f"-fuse-ld={linker}", *base[2:]] if linker else base
    res.commands.append(cmd)
    res.linker = linker or "default"
    t1 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=build_dir, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 and linker:
            # The faster linker refused what the default one may take: the default decides. With
            # a signature binding, a refusal both share (an alias to a function the host code
            # does not define with the declared types) is the binding's, not the linker's.
            said = (proc.stdout + proc.stderr).strip()
            res.log += f"[link -fuse-ld={linker}]\n{said}\n"
            res.commands.append(base)
            proc = subprocess.run(base, cwd=build_dir, capture_output=True, text=True, timeout=timeout)
            if proc.returncode == 0 or binding is None:
                _linker_failed(flags.cxx, flags.identity, linker, said)
                res.linker = f"default ({linker} failed: {(said.splitlines() or [''])[0][:200]})"
        if proc.returncode != 0 and binding is not None:  # load_inline's main.cpp decides
            said = (proc.stdout + proc.stderr).strip()
            res.log += f"[link]\n{said}\n"
            res.binding_failed = True
            first = next((ln.strip() for ln in said.splitlines() if "undefined" in ln or "error" in ln), said[:200])
            return done(f"fast link failed: {first[:300]}")
        if proc.returncode != 0 and res.lean:  # the lean list refused: torch's own list decides
            res.log += f"[lean link]\n{proc.stdout}{proc.stderr}\n"
            res.lean = False
            res.commands.append(full)
            proc = subprocess.run(full, cwd=build_dir, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return done(f"fast link: {exc}")
    res.steps["link"] = time.perf_counter() - t1
    if proc.returncode != 0:
        res.log += f"[link]\n{proc.stdout}{proc.stderr}\n"
        text = proc.stdout + proc.stderr
        first = next((ln.strip() for ln in text.splitlines() if "ld:" in ln or "undefined reference" in ln), "")
        return done("fast link failed: " + (first[:300] or _first_error(text)))
    os.replace(tmp, so)
    res.so = str(so)
    return done()


# torch's libraries that libtorch_python.so brings along: it needs libtorch.so, which needs
# libtorch_cpu, libtorch_cuda, libc10, libc10_cuda and the CUDA runtime, so an extension linked
# against libtorch_python alone finds every one of them in its own dependency tree when it loads,
# the same copies torch loaded (the dynamic linker matches them by name). The link then reads
# neither libtorch_cpu.so (about 400 MB) nor libtorch_cuda.so: 0.053 s instead of 0.208 s for the
# GELU extension with GNU ld on 2 cores here (benchmarks/results/link_time_cpu.md; the H200's
# default link took 0.25 s, a seventh of a kernel-body edit's 1.7 s: benchmarks/results/link_time.md). An extension that then does not load is linked again with the
# whole list (relink_full) before anything else is tried. KERNEL_LSP_LEAN_LINK=0 keeps torch's list.
_TRANSITIVE = frozenset({"c10", "c10_cuda", "torch", "torch_cpu", "torch_cuda", "cudart"})


def lean_ldflags(ldflags: list[str] | tuple[str, ...]) -> list[str] | None:
    """torch's link flags less the libraries libtorch_python.so brings along; None when they do not
    name libtorch_python (nothing to lean on) or the lean link is turned off."""
    if os.environ.get("KERNEL_LSP_LEAN_LINK", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if "-ltorch_python" not in ldflags:
        return None
    out = [f for f in ldflags if not (f.startswith("-l") and f[2:] in _TRANSITIVE)]
    return out if len(out) < len(ldflags) else None


def relink_full(fb: FastBuild, timeout: float = STEP_TIMEOUT) -> str:
    """Link a lean-linked extension again with torch's whole list, in place; "" when done, else why not."""
    if not fb.lean or not fb.full_link or not fb.so:
        return "it was not linked lean"
    so = Path(fb.so)
    cmd = [*fb.full_link[:-1], str(so) + f".{os.getpid()}.full"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=so.parent, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the full link: {exc}"
    fb.steps["relink"] = time.perf_counter() - t0
    fb.commands.append(cmd)
    if proc.returncode != 0:
        return "the full link failed: " + _first_error(proc.stdout + proc.stderr)[:300]
    os.replace(cmd[-1], so)
    fb.lean = False
    return ""


# Linkers faster than the default GNU ld for a shared object of three units against torch's
# libraries, best first: the link of a kernel-body edit took 0.50 s with ld.bfd and 0.18 s with gold
# on 2 cores here (benchmarks/link_time.py; the H200's: benchmarks/results/link_time.md).
# KERNEL_LSP_LINKER=default keeps the compiler's.
# A linker that failed a real link here (gold cannot read every library a newer toolchain makes)
# is not tried again: in this process, nor in later ones (a note in the build cache, per compiler
# and torch build).
_LINKERS = ("lld", "gold")
_linker_refused: set[tuple[str, str]] = set()


def fast_linker(cxx: str, identity: str = "") -> str | None:
    """The first faster linker (for ``-fuse-ld=``) the compiler can drive here, else None."""
    want = os.environ.get("KERNEL_LSP_LINKER", "").strip()
    if want == "default":
        return None
    for name in ((want,) if want else _LINKERS):
        if (cxx, name) in _linker_refused or _refusal_note(cxx, identity, name).exists():
            continue
        if _linker_works(cxx, name):
            return name
    return None


def _refusal_note(cxx: str, identity: str, name: str) -> Path:
    key = hashlib.sha256(f"{tool_id(cxx)}\n{identity}".encode()).hexdigest()[:16]
    return cache_root() / "linkers" / f"{name}-{key}.failed"


@functools.lru_cache(maxsize=16)
def _linker_works(cxx: str, name: str) -> bool:
    if shutil.which(f"ld.{name}") is None:
        return False
    try:  # the compiler must accept the flag and find that linker (about 20 ms, once)
        proc = subprocess.run([cxx, f"-fuse-ld={name}", "-Wl,--version"], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _linker_failed(cxx: str, identity: str, name: str, said: str) -> None:
    _linker_refused.add((cxx, name))
    note = _refusal_note(cxx, identity, name)
    with contextlib.suppress(OSError):
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(said[-4000:])


_UNDECLARED = re.compile(r'identifier "(\w+)" is undefined|has no member "(\w+)"|"(\w+)" is not a|'
                         r"'(\w+)' was not declared|'(\w+)' does not name a type")


def _full_prelude_may_help(log: str, nvcc: str) -> bool:
    """Does the compiler's log name something the full prelude's extra headers declare?"""
    declared = _full_prelude_names(nvcc)
    if not declared:
        return True  # the headers are not where nvcc's are: try, rather than blame the code
    names = {n for m in _UNDECLARED.finditer(log) for n in m.groups() if n}
    return bool(names & declared)


@functools.cache
def _full_prelude_names(nvcc: str) -> frozenset[str]:
    """Every word of cuda_fp16.h and cuda_bf16.h (and their .hpp): what the light prelude leaves out
    (std:: names, <algorithm>'s, always get the full prelude)."""
    words: set[str] = set()
    inc = Path(_cuda_home(nvcc)) / "include"
    for name in ("cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp"):
        with contextlib.suppress(OSError):
            words.update(re.findall(r"\w+", (inc / name).read_text(errors="replace")))
    return frozenset(words)


def _full_if_light(parts: inline_split.Split) -> str:
    return parts.device_full if parts.device_full != parts.device else ""


def _start(t0: float | None = None) -> tuple[FastBuild, Callable[..., FastBuild]]:
    t0 = time.perf_counter() if t0 is None else t0
    res = FastBuild()

    def done(reason: str = "") -> FastBuild:
        res.reason = reason
        res.seconds = time.perf_counter() - t0
        return res

    return res, done


def build_inline(args: dict[str, Any], nvcc: str, link: bool = True, timeout: float = STEP_TIMEOUT) -> FastBuild:
    """Build load_inline's bound arguments ``args`` (name and build_directory already set to
    the cache's) the fast way; ``FastBuild.so`` on success, else ``reason``."""
    res, done = _start()
    for unsupported in ("sycl_sources", "extra_sycl_cflags"):
        if args.get(unsupported):
            return done(f"{unsupported} given")
    raw = args.get("cuda_sources") or []
    cuda = [raw] if isinstance(raw, str) else [str(x) for x in raw]  # as load_inline joins them
    if not "".join(cuda).strip():
        return done("no CUDA sources")
    if args.get("keep_intermediates") is False:
        return done("keep_intermediates=False")
    name = str(args["name"])
    build_dir = Path(str(args["build_directory"]))
    build_dir.mkdir(parents=True, exist_ok=True)
    cuda_text = "\n".join(cuda)
    if not args.get("no_implicit_headers"):
        # load_inline puts these first; the split keeps torch/types.h on the host side only.
        cuda_text = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + cuda_text
    # Name-free file names (the build folder's name carries the candidate's hash): another
    # candidate with the same host code or main.cpp then has the same unit text (unit_cache).
    parts = inline_split.split(cuda_text, filename="cuda.cu")
    # The units' `#line` names, as real files beside them (what load_inline writes too): a
    # compiler error's "cuda.cu(8)" then reads back to the candidate's own line.
    _write_if_changed(build_dir / "cuda.cu", cuda_text)
    _write_if_changed(build_dir / "main.cpp", main_cpp(args))
    if not parts.ok:
        return done(parts.fallback_reason)
    extra_cuda = _as_list(args.get("extra_cuda_cflags"))
    name_def = f"#define TORCH_EXTENSION_NAME {name}\n"
    units = [Unit("device", "device", parts.device, extra_cuda, full_text=_full_if_light(parts)),
             Unit("host", "host", name_def + parts.host, _pch_safe(host_flags_from_cuda(extra_cuda))),
             Unit("main", "main", name_def + '#line 1 "main.cpp"\n' + main_cpp(args),
                  _pch_safe(_as_list(args.get("extra_cflags"))))]
    bind, why = bindings.of(args) if bindings.enabled() else (None, f"${bindings.OFF_ENV}=0")
    if bind is None:
        res.binding = why
        return _build_units(units, args, nvcc, res, done, link, timeout)
    table, no_table = _table_codes(bind)
    by_signature = Unit("main", "main", name_def + '#line 1 "main.cpp"\n' + bind.text(), binding_flags(units[2].flags))
    # The table first (one main.cpp for every such signature: compiled once per machine, ahead);
    # a type it has not (std::tuple, a non-const reference), or its main.cpp failing to build
    # here, leaves this signature's own text; a failure of that, load_inline's.
    attempts = [(f"by signature ({no_table})" if no_table not in ("", "off") else "by signature", by_signature, None)]
    if table:
        attempts.insert(0, ("by table", Unit("main", "main", name_def + table_main_text(),
                                             binding_flags(units[2].flags)), table))
    failures: list[str] = []
    logs: list[str] = []
    tried = 0.0
    for how, main, codes in attempts:
        got = _build_units([*units[:2], main], args, nvcc, res, done, link, timeout, bind, codes)
        if not got.binding_failed:
            got.binding = how if not failures else f"{how} (after {'; '.join(failures)})"
            if tried:
                got.steps["binding_attempt"] = round(tried, 3)
            return got
        kind = "table" if codes else "signature"
        failures.append(f"the {kind} binding failed ({got.reason[:200]})")
        logs.append(f"[{kind} binding]\n{got.log[-2000:]}\n")
        tried = got.seconds  # from the build's start to this attempt's end
        res, done = _start(time.perf_counter() - got.seconds)
        if codes and "undefined reference" in got.reason:
            break  # a declaration the code does not define: by signature it fails the same way
    # load_inline's own main.cpp: its errors are the user's (the other units come from the cache)
    res.steps["binding_attempt"] = round(tried, 3)
    res.binding = f"load_inline's text: {'; '.join(failures)}"
    res.log = "".join(logs)
    return _build_units(units, args, nvcc, res, done, link, timeout)


def table_main_text() -> str:
    """The table binding's main.cpp as a unit's text (after the extension's name)."""
    return '#line 1 "klsp_table_main.cpp"\n' + table_binding.MAIN


def binding_flags(flags: list[str]) -> list[str]:
    """The user's extra_cflags that reach a main.cpp bound by signature: not -g or -W levels
    (declarations and pybind glue behave the same without them), so most files share an object."""
    return [f for f in flags if not re.fullmatch(r"-g\w*|-W[\w=-]*|-w", f)]


# -- load(): source files ------------------------------------------------------------------------------

CPP_SUFFIXES = (".cpp", ".cc", ".cxx")
_USES_TORCH = re.compile(r"\b(?:torch|at|c10|pybind11)::|\bPYBIND11_MODULE\b|\bTORCH_(?:CHECK|LIBRARY)|\bAT_DISPATCH_")
_TORCH_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](?:torch|ATen|c10|pybind11)/', re.M)
_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*(?:"([^"]+)"|<([^>]+)>)', re.M)


def local_headers(path: Path, text: str, dirs: list[str], limit: int = 64) -> list[Path]:
    """The headers ``text`` (the file at ``path``) includes, and those include, that are the
    user's: ``"x.h"`` found beside the including file or in ``dirs`` (extra_include_paths),
    ``<x.h>`` found in ``dirs``; in the order first seen, at most ``limit``."""
    out: list[Path] = []
    todo = [(path, text)]
    seen = {path}
    while todo and len(out) < limit:
        here, body = todo.pop(0)
        for quoted, angled in _LOCAL_INCLUDE.findall(body):
            where = [str(here.parent), *dirs] if quoted else list(dirs)
            for d in where:
                found = Path(d) / (quoted or angled)
                if found.is_file():
                    found = found.resolve()
                    if found not in seen and len(out) < limit:
                        seen.add(found)
                        out.append(found)
                        with contextlib.suppress(OSError):
                            todo.append((found, found.read_text(errors="replace")))
                    break
    return out


def _includes_torch(path: Path, text: str, dirs: list[str]) -> bool:
    """``text`` (the file at ``path``) or one of the user's headers it includes includes a torch header."""
    if _TORCH_INCLUDE.search(text):
        return True
    for h in local_headers(path, text, dirs):
        with contextlib.suppress(OSError):
            if _TORCH_INCLUDE.search(h.read_text(errors="replace")):
                return True
    return False


def _step_names(paths: list[Path]) -> list[str]:
    out: list[str] = []
    for p in paths:
        stem = re.sub(r"\W", "_", p.stem)[:40] or "src"
        step, n = stem, 1
        while step in out:
            n += 1
            step = f"{stem}_{n}"
        out.append(step)
    return out


def build_load(args: dict[str, Any], nvcc: str, link: bool = True, timeout: float = STEP_TIMEOUT) -> FastBuild:
    """Build ``load()``'s bound arguments (name and build_directory already set to the cache's)
    the fast way: each ``.cu`` split into a device unit and a host unit (as load_inline's CUDA
    source, without its implicit includes), each ``.cpp`` a host unit as written (against the
    light main header, the full one if it needs more); every unit finds its file's ``"x.h"``
    includes where torch, which compiles the files in place, would."""
    res, done = _start()
    for unsupported in ("extra_sycl_cflags", "with_sycl", "is_standalone"):
        if args.get(unsupported):
            return done(f"{unsupported} given")
    if args.get("keep_intermediates") is False:
        return done("keep_intermediates=False")
    if args.get("with_cuda") is False:
        return done("with_cuda=False")
    raw = args.get("sources") or []
    given = [str(raw)] if isinstance(raw, (str, os.PathLike)) else [str(x) for x in raw]
    for g in given:
        if not g.endswith((".cu", *CPP_SUFFIXES)):
            return done(f"source {g}: only .cu and .cpp/.cc/.cxx files take the fast path")
    cus = [g for g in given if g.endswith(".cu")]
    if not cus:
        return done("no .cu source")
    paths = [Path(os.path.abspath(g)) for g in given]
    texts: list[str] = []
    for g, p in zip(given, paths):
        try:
            texts.append(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            return done(f"source {g}: {exc}")
    name = str(args["name"])
    build_dir = Path(str(args["build_directory"]))
    build_dir.mkdir(parents=True, exist_ok=True)
    inc_dirs = [os.path.abspath(d) for d in _as_list(args.get("extra_include_paths"))]
    for g, p, text in zip(given, paths, texts):
        # The units are compiled with a torch header forced in: a file that uses torch without
        # including it would build here and fail the normal way. Say so; do not change the verdict.
        if _USES_TORCH.search(text) and not _includes_torch(p, text, inc_dirs):
            return done(f"{g} uses torch but includes none of its headers")
    extra_cuda = _as_list(args.get("extra_cuda_cflags"))
    host_cuda = _pch_safe(host_flags_from_cuda(extra_cuda))
    extra_cflags = _pch_safe(_as_list(args.get("extra_cflags")))
    name_def = f"#define TORCH_EXTENSION_NAME {name}\n"
    units: list[Unit] = []
    hosts: list[Unit] = []
    kernel_file: dict[str, str] = {}
    for g, p, text, step in zip(given, paths, texts, _step_names(paths)):
        folder = [str(p.parent)]
        if g.endswith(".cu"):
            # Several .cu files: anonymous namespaces get names of their own per file.
            tag = f"_{len(units)}_" if len(cus) > 1 else ""
            parts = inline_split.split(text, filename=str(p), anon_tag=tag)
            if not parts.ok:
                return done(f"{g}: {parts.fallback_reason}")
            for k in parts.kernels:
                if kernel_file.setdefault(k.name, g) != g:
                    # their launchers would share a name (template ones would merge silently)
                    return done(f"kernel {k.name} is defined in {kernel_file[k.name]} and {g}")
            units.append(Unit(f"device_{step}", "device", parts.device, extra_cuda, folder,
                              f'device unit of "{g}"', _full_if_light(parts)))
            host = name_def + parts.host
            hosts.append(Unit(f"host_{step}", "main" if "PYBIND11_MODULE" in host else "host", host, host_cuda,
                              folder, f'host unit of "{g}"'))
        else:
            hosts.append(Unit(f"cpp_{step}", "main", name_def + f'#line 1 "{p}"\n' + text, extra_cflags, folder,
                              f'unit of "{g}"'))
    return _build_units(units + hosts, args, nvcc, res, done, link, timeout)


# -- made ahead of the first build ---------------------------------------------------------------------

def prepare(nvcc: str, check_only: bool = False, timeout: float = STEP_TIMEOUT) -> dict[str, Any]:
    """Make the light precompiled headers every fast build needs, before any build asks (a
    build-pool Worker does this when the server or the CLI starts). A build that needs them
    meanwhile waits on the same lock and finds them made (ensure_pch). ``check_only``: only say
    whether there is work. {"state": "ready" | "needed" | "made" | "failed" | "unavailable", ...}"""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return {"state": "unavailable", "reason": "torch is not installed in the Worker's Python"}
    if shutil.which(nvcc) is None and not os.path.exists(nvcc):
        return {"state": "unavailable", "reason": "no nvcc (CUDA toolkit) found"}
    try:
        flags = torch_flags(nvcc)
    except Exception as exc:  # noqa: BLE001 - then the builds take the normal way and say so
        return {"state": "unavailable", "reason": f"torch's build flags: {exc}"[:300]}
    out: dict[str, Any] = {"torch": torch.__version__, "pch_root": str(pch_root()), "pid": os.getpid()}
    missing = [k for k, text in LIGHT_HEADERS.items() if not (pch_dir(flags, text) / "klsp_torch.h.gch").exists()]
    if not missing:
        if not check_only:
            start_prebuild(flags, timeout)
        return {**out, "state": "ready"}
    if check_only:
        return {**out, "state": "needed", "missing": missing}
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(missing)) as pool:
        made = dict(zip(missing, pool.map(lambda k: ensure_pch(flags, timeout, (LIGHT_HEADERS[k],)), missing)))
    errors = [f"{k}: {why}" for k, (pch, why, _) in made.items() if pch is None]
    out.update(seconds=round(time.perf_counter() - t0, 2), made=[k for k, (_, _, secs) in made.items() if secs])
    if errors:
        return {**out, "state": "failed", "reason": "; ".join(errors)[:500]}
    start_prebuild(flags, timeout)
    return {**out, "state": "made"}


_PREBUILD: list[threading.Thread] = []
PREBUILT = "prebuilt.json"


def start_prebuild(flags: TorchFlags, timeout: float = STEP_TIMEOUT) -> threading.Thread | None:
    """Build the table binding's main.cpp (on every machine where builds bind by table: one g++)
    or the common signature bindings (binding.COMMON, on machines with the cores) ahead, in a
    thread of this process, once: a later build takes its object from the unit cache (or waits
    on its lock while it compiles) instead of compiling main.cpp for 5 s. Nobody waits for it."""
    count = bindings.prebuild_count()
    if (count == 0 and not table_here()) or _PREBUILD:
        return None
    t = threading.Thread(target=prebuild_bindings, args=(flags, count, timeout), name="klsp-prebuild-bindings",
                         daemon=True)
    _PREBUILD.append(t)
    t.start()
    return t


PREBUILT_NAME = "klsp_prebuilt"  # the extension name of an object built ahead (renamed on reuse)


def _table_codes(b: bindings.Binding) -> tuple[list[tuple[str, str]], str]:
    """How a build binds ``b`` by table: its codes, or ([], why not; "off" when turned off)."""
    return table_binding.codes_of(b) if table_binding.enabled() else ([], "off")


def table_here() -> bool:
    """Whether builds here bind by table (table_binding.py): on, and this machine's convention."""
    return bindings.enabled() and bool(_table_codes(bindings.common(1)[0])[0])


def _compile_main(flags: TorchFlags, pch: Path, text: str, unit_flags: list[str], folder: Path,
                  timeout: float) -> float | str:
    """A main.cpp (``text`` after the extension's name) into the unit cache, by the command a
    build would run (the same text but for the name, the same flags and precompiled header):
    seconds compiling, 0.0 when the cache had it, or "failed: ..."."""
    folder.mkdir(parents=True, exist_ok=True)
    u = Unit("main", "main", f"#define TORCH_EXTENSION_NAME {PREBUILT_NAME}\n" + text, unit_flags)
    cmd = _unit_cmd(flags, u, pch, False, folder, [])
    rc, log, secs = unit_cache.compile_all({"main": cmd}, folder, timeout, FastBuild(), flags.identity,
                                           {"main": unit_cache.UnitContext(PREBUILT_NAME)}, flags.includes)["main"]
    return round(secs, 2) if rc == 0 else f"failed: {_first_error(log)}"


TABLE_KEY = "table binding (every signature of its types)"


def _compile_binding(flags: TorchFlags, pch: Path, b: bindings.Binding, unit_flags: list[str], folder: Path,
                     timeout: float) -> tuple[str, Any]:
    """The main.cpp a build of ``b`` would compile, into the unit cache: the table binding's
    when it serves ``b``, else ``b``'s by signature. (what it is, _compile_main's answer)."""
    if _table_codes(b)[0]:
        return TABLE_KEY, _compile_main(flags, pch, table_main_text(), unit_flags, folder, timeout)
    sig = " ; ".join(f"{ret}({', '.join(params)})" for _, _, ret, params in b.functions)
    return sig, _compile_main(flags, pch, '#line 1 "main.cpp"\n' + b.text(), unit_flags, folder, timeout)


def prebuild_bindings(flags: TorchFlags, count: int, timeout: float = STEP_TIMEOUT) -> dict[str, Any]:
    """Compile the table binding's main.cpp (one object serves every signature of its types) or,
    where builds do not bind by table, the first ``count`` of binding.COMMON into the unit cache,
    a few at a time; what each took goes to <build cache>/prebuild/prebuilt.json. {what:
    seconds compiling, 0 if cached}."""
    pch, why, _ = ensure_pch(flags, timeout, (LIGHT_MAIN,))
    root = cache_root() / "prebuild"
    if pch is None:
        return {"error": why}
    if table_here():
        done = {TABLE_KEY: _compile_main(flags, pch, table_main_text(), [], root / "table", timeout)}
    else:
        # Two at a time on 16 cores: a user's build of the same signature waits on its lock, so
        # these run at the normal priority (a niced one could starve behind six benches'
        # compiles), and few.
        parallel = max(1, min(2, (os.cpu_count() or 1) // 8))

        def one(item: tuple[int, bindings.Binding]) -> tuple[str, Any]:
            i, b = item
            return _compile_binding(flags, pch, b, [], root / f"signature_{i}", timeout)

        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            done = dict(pool.map(one, enumerate(bindings.common(count))))
    _write_if_changed(root / PREBUILT, json.dumps({"at": time.time(), "pid": os.getpid(), "signatures": done}))
    return done


def source_bindings(source: str) -> tuple[list[tuple[bindings.Binding, list[str]]], str]:
    """The bindings a Python source's load_inline calls would build (read, never run), each with
    the flags of its main.cpp; ([], why) when there are none."""
    found: list[tuple[bindings.Binding, list[str]]] = []
    why = "no load_inline call with literal cpp_sources and functions"
    for kw in bindings.literal_calls(source):
        if kw is None:
            continue
        if kw.get("extra_include_paths"):  # they reach the unit's command: a build's own business
            why = "its load_inline names extra_include_paths"
            continue
        b, said = bindings.of(kw)
        flags = kw.get("extra_cflags")
        if b is None or flags is ...:
            why = said or "its extra_cflags are not literals"
            continue
        found.append((b, binding_flags(_pch_safe(_as_list(flags)))))
    return found, "" if found else why


def prebuild_source(source: str, nvcc: str, timeout: float = STEP_TIMEOUT) -> dict[str, Any]:
    """main.cpp of each load_inline call in ``source`` compiled by signature into the unit cache
    (no module code runs: the calls are read from the syntax tree), so that the file's first
    build finds it. {"state": "made" | "cached" | "none" | "unavailable", "signatures": {...}}."""
    found, why = source_bindings(source)
    if not found:
        return {"state": "none", "reason": why}
    try:
        flags = torch_flags(nvcc)
    except Exception as exc:  # noqa: BLE001 - the build then takes its own way
        return {"state": "unavailable", "reason": f"torch's build flags: {exc}"[:300]}
    pch, why, _ = ensure_pch(flags, timeout, (LIGHT_MAIN,))
    if pch is None:
        return {"state": "unavailable", "reason": why}
    root = cache_root() / "prebuild"
    root.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ahead_", dir=root) as d:
        for i, (b, unit_flags) in enumerate(found):
            sig, got = _compile_binding(flags, pch, b, unit_flags, Path(d) / str(i), timeout)
            done[sig] = got
    made = any(isinstance(v, float) and v > 0 for v in done.values())
    failed = [v for v in done.values() if isinstance(v, str)]
    state = "failed" if failed and not made else "made" if made else "cached"
    return {"state": state, "signatures": done}


def prebuild_source_op(params: dict[str, Any], build: Any) -> dict[str, Any]:
    """The Worker's ``prebuild_binding`` op: ``params["source"]``, a Python file's text."""
    if not build.fast_inline_enabled():
        return {"state": "unavailable", "reason": "the fast build is off (fast_inline)"}
    if not bindings.enabled():
        return {"state": "unavailable", "reason": f"${bindings.OFF_ENV}=0"}
    return prebuild_source(str(params.get("source") or ""), build._find_nvcc(params.get("options")),
                           float(params.get("timeout") or STEP_TIMEOUT))


def prepare_op(params: dict[str, Any], build: Any) -> dict[str, Any]:
    """The Worker's ``prepare_build`` op (no candidate: torch's headers only)."""
    if not build.fast_inline_enabled():
        return {"state": "unavailable", "reason": "the fast build is off (fast_inline)"}
    return prepare(build._find_nvcc(params.get("options")), bool(params.get("check_only")))

"""Finding nvcc, its version, and the command lines kernel-lsp runs it with."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass, field

from kernel_lsp.toolchain.occupancy import arch_number

DEFAULT_ARCH = "sm_90"
_FALLBACK_DIRS = ("/usr/local/cuda/bin",)


class ToolchainError(RuntimeError):
    """nvcc is missing, broken or misconfigured; the message says which setting fixes it."""


def find_nvcc(configured: str | None = None) -> str | None:
    """The nvcc to run: the setting, else $CUDA_HOME/bin, PATH, /usr/local/cuda/bin.

    A configured path that does not exist gives None (the caller reports the setting);
    a configured bare name ("nvcc") is looked up like an unset one.
    """
    if configured and (os.sep in configured or configured.startswith(".")):
        path = os.path.abspath(os.path.expanduser(configured))
        return path if os.path.isfile(path) else None
    name = configured or "nvcc"
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            candidate = os.path.join(root, "bin", name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    found = shutil.which(name)
    if found:
        return found
    for directory in _FALLBACK_DIRS:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


@functools.lru_cache(maxsize=16)
def _version(nvcc: str, mtime: float) -> str:
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        raise ToolchainError(f"cannot run nvcc at {nvcc}: {exc.strerror or exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise ToolchainError(f"`{nvcc} --version` did not answer within 30 s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ToolchainError(f"`{nvcc} --version` failed (exit {proc.returncode}): {tail[0]}")
    m = re.search(r"release [\d.]+, V([\d.]+)", proc.stdout) or re.search(r"release ([\d.]+)", proc.stdout)
    if not m:
        raise ToolchainError(f"{nvcc} does not look like nvcc: `--version` printed no CUDA release")
    return m.group(1)


def nvcc_version(nvcc: str) -> str:
    """'13.0.88' for the given nvcc (cached per path and modification time).

    Raises ToolchainError when it cannot be run or does not answer like nvcc.
    """
    try:
        mtime = os.stat(nvcc).st_mtime
    except OSError as exc:
        raise ToolchainError(f"nvcc not found at {nvcc}") from exc
    return _version(nvcc, mtime)


def torch_include_paths() -> list[str]:
    """torch's C++ include dirs, found without importing torch (the server must not)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = os.path.join(list(spec.submodule_search_locations)[0], "include")
    paths = [root, os.path.join(root, "torch", "csrc", "api", "include")]
    return [p for p in paths if os.path.isdir(p)]


def python_include_path() -> str | None:
    path = sysconfig.get_paths().get("include")
    return path if path and os.path.isdir(path) else None


# What torch.utils.cpp_extension passes to nvcc, so embedded sources see the same macros.
TORCH_NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
)


@dataclass
class CompileOptions:
    nvcc: str | None = None          # a path, a bare name, or None: found by find_nvcc
    arch: str = DEFAULT_ARCH
    flags: list[str] = field(default_factory=list)
    include_paths: list[str] = field(default_factory=list)
    defines: dict[str, str | None] = field(default_factory=dict)
    torch_headers: bool = False      # add torch's and Python's include dirs (load_inline sources)
    std: str = "c++17"
    extension_name: str = "kernel_lsp_ext"  # TORCH_EXTENSION_NAME when torch_headers

    def key(self) -> str:
        """A stable text for cache keys."""
        defines = sorted((k, v or "") for k, v in self.defines.items())
        return repr((self.nvcc, self.arch, self.flags, self.include_paths, defines,
                     self.torch_headers, self.std, self.extension_name))


def validate_arch(arch: str) -> str | None:
    """None when `arch` is a well-formed sm_/compute_ name, else a message."""
    try:
        arch_number(arch)
    except ValueError as exc:
        return str(exc)
    return None


def common_flags(options: CompileOptions) -> list[str]:
    flags = [f"-arch={options.arch}", f"-std={options.std}"]
    for path in options.include_paths:
        flags.append(f"-I{path}")
    if options.torch_headers:
        for path in torch_include_paths():
            flags.append(f"-I{path}")
        py = python_include_path()
        if py:
            flags.append(f"-I{py}")
        flags.extend(TORCH_NVCC_FLAGS)
        flags.append(f"-DTORCH_EXTENSION_NAME={options.extension_name}")
        flags.append("-DTORCH_API_INCLUDE_EXTENSION_H")
    for name, value in sorted(options.defines.items()):
        flags.append(f"-D{name}" if value is None else f"-D{name}={value}")
    flags.extend(options.flags)
    return flags


def nvcc_command(
    source_file: str,
    *,
    options: CompileOptions,
    out_path: str,
    mode: str = "cubin",
    nvcc: str | None = None,
) -> list[str]:
    """The nvcc command line for `mode` "cubin" (the on-save check: -cubin -Xptxas -v
    -lineinfo) or "shared" (the fast build: a -shared -fPIC -O3 .so with an extern "C"
    launcher)."""
    exe = nvcc or find_nvcc(options.nvcc) or options.nvcc or "nvcc"
    if mode == "cubin":
        head = ["-cubin", "-Xptxas", "-v", "-lineinfo"]
    elif mode == "shared":
        head = ["-shared", "-Xcompiler", "-fPIC", "-O3", "-lineinfo", "-Xptxas", "-v"]
    else:
        raise ValueError(f"unknown nvcc mode {mode!r} (expected 'cubin' or 'shared')")
    return [exe, *head, *common_flags(options), "-x", "cu", "-o", out_path, source_file]


# Arch-specific targets (the "a" suffix) and the first CUDA release that compiles each: they
# enable instructions the base target refuses (sm_90a: wgmma, TMA, setmaxnreg; sm_100a/103a:
# tcgen05). Their cubins run only on that exact architecture, which is the GPU being measured.
ARCH_SPECIFIC_SINCE: dict[int, tuple[int, int]] = {
    90: (12, 0), 100: (12, 8), 101: (12, 8), 120: (12, 8), 103: (12, 9), 121: (12, 9), 110: (13, 0),
}


def device_arch(major: int, minor: int, nvcc: str | None = None) -> str:
    """The target for a GPU of capability major.minor: `sm_90a` where the architecture has an
    arch-specific target and this nvcc compiles it, else `sm_90` (an older nvcc, or a GPU
    without one: sm_80, sm_89); without an nvcc to ask, the base target."""
    base = f"sm_{major}{minor}"
    since = ARCH_SPECIFIC_SINCE.get(major * 10 + minor)
    path = find_nvcc(nvcc)
    if since is None or path is None:
        return base
    try:
        release = tuple(int(x) for x in nvcc_version(path).split(".")[:2])
    except (ToolchainError, ValueError):
        return base
    return base + "a" if release >= since else base


def capability_arch(capability: object, nvcc: str | None = None) -> str | None:
    """device_arch for a compute capability as nvidia-smi ("9.0") or the Worker's device_info
    ([9, 0]) give it; None when it does not read as one. Every process that keys a build by arch
    (the CPU pool building ahead, the GPU Worker loading) must name the same target: a pool build
    keyed sm_90 is not the Worker's sm_90a, which then builds the device code again."""
    if isinstance(capability, str):
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", capability)
        parts = (m.group(1), m.group(2)) if m else ()
    elif isinstance(capability, (list, tuple)):
        parts = tuple(capability)
    else:
        parts = ()
    if len(parts) != 2:
        return None
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (TypeError, ValueError):
        return None
    return device_arch(major, minor, nvcc)

"""The sandbox every Worker that imports or runs a Candidate lives in (standard library only).

On Linux it is bubblewrap (``bwrap``): a new network namespace (loopback only), a new
pid namespace, the whole filesystem read-only, the user's home folder and ``/tmp``
replaced by small private tmpfs mounts, and only what the toolchain must read bound
back in (the Python environment, kernel-lsp itself, CUDA) plus what it must write
(the build caches: kernel-lsp's, torch's extensions, Triton's, Inductor's, CUDA's JIT
cache). GPU device nodes (``/dev/nvidia*``, ``/dev/dri``) pass through. Limits: a
per-sandbox process count (the pid namespace's ``pid_max`` where the kernel allows it,
``RLIMIT_NPROC`` otherwise), a file size limit, core dumps off, and an address-space
limit for GPU-less Workers only (CUDA reserves far more virtual memory than it uses).

Here: ``resolve(mode)`` turns the ``sandbox`` setting (``required | auto | off``)
into a ``Sandbox`` or None, ``wrap()`` turns a Worker's command line into a sandboxed one,
``status()`` says whether a sandbox is available and how to install one.
The Worker applies the limits and names the fence a candidate hit (worker/fences.py).
docs/sandbox.md says what is fenced and what is not.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lsp.engine import protocol

log = logging.getLogger(__name__)

MODES = ("required", "auto", "off")
ENV = protocol.SANDBOX_ENV           # set inside a sandboxed Worker: its limits, as JSON
VIOLATION = protocol.SANDBOX_VIOLATION
MIB = 1024 * 1024
PID_RESERVED = 300                   # the kernel recycles pids from here: a pid_max below it wastes them

INSTALL_HINT = (
    "install bubblewrap: `sudo apt-get install bubblewrap` (Debian/Ubuntu), "
    "`sudo dnf install bubblewrap` (Fedora), `sudo pacman -S bubblewrap` (Arch)"
)


class SandboxUnavailable(RuntimeError):
    """``sandbox = "required"`` and no sandbox can run here: candidates are refused."""


@dataclass(frozen=True)
class Limits:
    processes: int = 1024            # tasks (processes and threads) in one sandbox
    file_mb: int = 1024              # RLIMIT_FSIZE: the largest file a candidate may write
    tmp_mb: int = 1024               # size of the private /tmp (and of the hidden home's tmpfs)
    address_space_mb: int = 32768    # RLIMIT_AS, only where no GPU is visible (the build pool)


@dataclass(frozen=True)
class Sandbox:
    """How Workers are fenced. ``readable`` / ``writable``: extra host paths to expose."""

    readable: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)

    def with_readable(self, *paths: str) -> "Sandbox":
        new = tuple(p for p in paths if p and p not in self.readable)
        return dataclasses.replace(self, readable=self.readable + new) if new else self


@dataclass(frozen=True)
class Status:
    available: bool
    tool: str | None        # e.g. "bubblewrap 0.8.0 (/usr/bin/bwrap)"
    reason: str             # why not, when not available
    hint: str               # how to get one ("" when available)

    def message(self) -> str:
        if self.available:
            return f"candidates run in a sandbox ({self.tool})"
        return f"candidates run WITHOUT a sandbox: {self.reason}" + (f"; {self.hint}" if self.hint else "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- availability -------------------------------------------------------------

_status_cache: dict[str, Status] = {}
_warned: list[bool] = []


def find_bwrap(path: str | None = None) -> str | None:
    """``bwrap`` on ``path`` (default: this process's PATH)."""
    return shutil.which("bwrap", path=path if path is not None else os.environ.get("PATH", os.defpath))


def status(refresh: bool = False) -> Status:
    """Whether a sandbox works here (probed once per bwrap: it starts one, about 5 ms),
    and how to install one. The server and the CLI show ``status().message()``."""
    if sys.platform == "darwin":
        return Status(False, None, "macOS has no sandbox for kernel-lsp Workers yet (Seatbelt is not used)",
                      "run candidates you did not write on a Linux machine with bubblewrap")
    if not sys.platform.startswith("linux"):
        return Status(False, None, f"no sandbox on {sys.platform}", "use Linux with bubblewrap")
    bwrap = find_bwrap()
    if bwrap is None:
        return Status(False, None, "bubblewrap (bwrap) is not installed", INSTALL_HINT)
    if not refresh and bwrap in _status_cache:
        return _status_cache[bwrap]
    _status_cache[bwrap] = result = _probe(bwrap)
    return result


def _probe(bwrap: str) -> Status:
    try:
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        run = subprocess.run(
            [bwrap, "--die-with-parent", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev",
             "--proc", "/proc", "--tmpfs", "/tmp", "--", "true"],
            capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return Status(False, None, f"bwrap cannot run: {exc}", INSTALL_HINT)
    if run.returncode != 0:
        why = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit status {run.returncode}"
        return Status(False, None, f"bwrap cannot create namespaces here ({why})",
                      "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or "
                      "AppArmor's kernel.apparmor_restrict_unprivileged_userns=0), or install bwrap setuid")
    return Status(True, f"{version or 'bubblewrap'} ({bwrap})", "", "")


def resolve(mode: "str | Sandbox | None") -> Sandbox | None:
    """The ``sandbox`` setting as a ``Sandbox`` (or None for no sandbox).
    ``required`` (or a ``Sandbox`` given outright) without a working sandbox raises
    ``SandboxUnavailable``; ``auto`` warns once and runs unfenced; ``off`` is None."""
    if isinstance(mode, Sandbox):
        spec, required = mode, True
    else:
        name = (mode or "auto").strip().lower()
        if name not in MODES:
            raise ValueError(f"setting 'sandbox' accepts {', '.join(MODES)}; got {mode!r}")
        if name == "off":
            return None
        spec, required = Sandbox(), name == "required"
    st = status()
    if st.available:
        return spec
    if required:
        raise SandboxUnavailable(
            f"sandbox = \"required\" but no sandbox can run candidates here: {st.reason}. "
            f"{st.hint[:1].upper() + st.hint[1:] if st.hint else ''}".strip()
            + " (or set sandbox = \"auto\" to run without one)")
    warn_once(st)
    return None


def configured_mode(root: str | None = None) -> str:
    """The ``sandbox`` setting of the workspace at ``root`` (default: the current folder):
    ``[tool.kernel-lsp] sandbox`` in the nearest pyproject.toml, else ``auto``."""
    from kernel_lsp.config import SettingsError, load_settings  # noqa: PLC0415 - caller side only

    try:
        return load_settings(root or os.getcwd()).sandbox
    except SettingsError as exc:
        raise SandboxUnavailable(f"cannot read the sandbox setting: {exc}") from exc


def warn_once(st: Status | None = None) -> str | None:
    """Log, once per process, that candidates run without a sandbox; the message, or None
    when already said (or a sandbox is available)."""
    st = st or status()
    if st.available or _warned:
        return None
    _warned.append(True)
    text = st.message()
    log.warning("%s", text)
    return text


# -- the command line ---------------------------------------------------------


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _abs(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def _home(env: dict[str, str]) -> str:
    return _abs(env.get("HOME") or os.path.expanduser("~"))


def shows(sandbox: "Sandbox | None", cwd: str | None, paths: "list[str] | tuple[str, ...]") -> bool:
    """Does a Worker started in ``sandbox`` (bound: its readable folders and ``cwd``) see every
    folder of ``paths``? A folder inside one of those is seen; no sandbox sees everything."""
    if sandbox is None:
        return True
    bound = [_abs(p) for p in (*sandbox.readable, *([cwd] if cwd else []))]
    return all(any(_under(_abs(p), b) for b in bound) for p in paths)


def hidden_roots(env: dict[str, str]) -> list[str]:
    """The host folders a sandbox replaces with an empty private tmpfs."""
    home = _home(env)
    return ["/tmp"] + ([home] if home != "/" and not _under(home, "/tmp") else [])


def hidden(path: str, env: dict[str, str] | None = None) -> bool:
    """Is ``path`` invisible in a sandbox unless bound in: strictly inside HOME or /tmp?
    (HOME or /tmp itself is never bound back: that would undo the hiding.)"""
    q = _abs(path)
    roots = hidden_roots(dict(os.environ) if env is None else env)
    return any(_under(p, h) and p != h for p in {q, os.path.realpath(q)} for h in roots)


def workspace_of(path: str, env: dict[str, str] | None = None) -> str:
    """The folder a task file's Worker must read: the project it belongs to (the folder above a
    ``.kernel-lsp/``, else the nearest one with ``pyproject.toml`` or ``.git``), never HOME or
    /tmp themselves; the file's own folder when no project is found. An op Task under
    ``.kernel-lsp/ops/`` imports its model two folders up; a candidate may import its neighbours."""
    folder = os.path.dirname(_abs(path))
    roots = hidden_roots(dict(os.environ) if env is None else env)
    parts = folder.split(os.sep)
    if ".kernel-lsp" in parts:
        above = os.sep.join(parts[: parts.index(".kernel-lsp")]) or os.sep
        if above not in roots and above != os.sep:
            return above
    probe = folder
    while probe not in roots and probe != os.sep:
        if os.path.exists(os.path.join(probe, "pyproject.toml")) or os.path.exists(os.path.join(probe, ".git")):
            return probe
        probe = os.path.dirname(probe)
    return folder


def cache_paths(env: dict[str, str]) -> dict[str, str]:
    """The caches a Worker writes, as its environment will resolve them."""
    home = _home(env)
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    user = env.get("USER") or env.get("LOGNAME") or "user"
    safe_user = "".join(c if c.isalnum() or c in "-_" else "_" for c in user)
    host_tmp = os.environ.get("TMPDIR") or "/tmp"
    paths = {
        "kernel-lsp": _abs(env.get("KERNEL_LSP_CACHE") or os.path.join(xdg, "kernel-lsp")),
        "torch extensions": _abs(env.get("TORCH_EXTENSIONS_DIR") or os.path.join(xdg, "torch_extensions")),
        "triton": _abs(env.get("TRITON_CACHE_DIR")
                       or os.path.join(env.get("TRITON_HOME") or home, ".triton", "cache")),
        "inductor": _abs(env.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(host_tmp, f"torchinductor_{safe_user}")),
        "cuda jit": _abs(env.get("CUDA_CACHE_PATH") or os.path.join(home, ".nv", "ComputeCache")),
    }
    if env.get("KERNEL_LSP_PCH_CACHE"):
        # The precompiled torch headers (fastbuild.pch_root), when kept apart from the build cache:
        # hidden (under /tmp or home), every sandboxed build would make them again.
        paths["precompiled headers"] = _abs(env["KERNEL_LSP_PCH_CACHE"])
    return paths


def _python_roots(python: str) -> list[str]:
    """What an interpreter needs to read: its install (through symlinks) and a venv's base."""
    exe = shutil.which(python) or python
    roots: list[str] = []
    for p in {_abs(exe), os.path.realpath(exe)}:
        prefix = os.path.dirname(os.path.dirname(p))
        roots.append(prefix)
        cfg = os.path.join(prefix, "pyvenv.cfg")
        try:
            for line in Path(cfg).read_text().splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    roots.append(os.path.dirname(os.path.realpath(value.strip())))
        except OSError:
            pass
    return roots


def gpu_nodes() -> list[str]:
    """The GPU device nodes to pass through. The driver makes /dev/nvidia-uvm on first use
    through the setuid ``nvidia-modprobe``, which cannot run inside: make it first."""
    if glob.glob("/dev/nvidia[0-9]*") and not os.path.exists("/dev/nvidia-uvm") and shutil.which("nvidia-modprobe"):
        try:
            subprocess.run(["nvidia-modprobe", "-u", "-c=0"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            pass
    return sorted(glob.glob("/dev/nvidia*")) + (["/dev/dri"] if os.path.isdir("/dev/dri") else [])


@dataclass
class Launch:
    """A sandboxed Worker's command line and the environment it starts with."""

    argv: list[str]
    env: dict[str, str]
    info_fd: int | None = None   # bwrap's --info-fd write end, to pass to the child
    binds: list[tuple[str, str]] = field(default_factory=list)  # (path, "ro" | "rw")


def wrap(argv: list[str], env: dict[str, str], cwd: str | None, sandbox: Sandbox, *,
         info_fd: int | None = None) -> Launch:
    """``argv`` (a Worker command) run under bubblewrap with ``sandbox``'s fences."""
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}")
    lim = sandbox.limits
    env = dict(env)
    home = _home(env)
    hidden = hidden_roots(env)
    caches = cache_paths(env)
    env["TORCHINDUCTOR_CACHE_DIR"] = caches["inductor"]  # the host's cache, not one in the private /tmp
    for var in ("TMPDIR", "TEMP", "TMP"):
        env[var] = "/tmp"
    gpu = env.get("CUDA_VISIBLE_DEVICES") != ""
    env[ENV] = json.dumps({"processes": lim.processes, "file_mb": lim.file_mb, "tmp_mb": lim.tmp_mb,
                           "address_space_mb": 0 if gpu else lim.address_space_mb, "home": home})

    # Search paths too: a ninja or nvcc in ~/.local/bin, CUDA libraries in a conda env.
    searched = [p for var in ("PYTHONPATH", "PATH", "LD_LIBRARY_PATH", "CPATH", "LIBRARY_PATH")
                for p in env.get(var, "").split(os.pathsep) if p]
    readable = [*_python_roots(argv[0]), str(Path(__file__).resolve().parents[3]), *searched,
                *[env[v] for v in ("CUDA_HOME", "CUDA_PATH", "VIRTUAL_ENV", "CONDA_PREFIX") if env.get(v)],
                os.path.join(home, ".local", "lib"), *(p for p in [cwd] if p), *sandbox.readable]
    writable = [*caches.values(), *sandbox.writable]
    wanted: dict[str, str] = {}
    for p in readable:
        for q in {_abs(p), os.path.realpath(_abs(p))}:
            if any(_under(q, h) and q != h for h in hidden) and os.path.exists(q):
                wanted.setdefault(q, "ro")
    for p in writable:
        q = _abs(p)
        if any(_under(h, q) for h in hidden):
            continue  # a hidden folder itself (or one above it) is never bound back
        try:
            os.makedirs(q, exist_ok=True)
        except OSError:
            continue
        wanted[q] = "rw"
    binds: list[tuple[str, str]] = []
    for q in sorted(wanted, key=lambda s: (s.count("/"), s)):
        mode = wanted[q]
        if mode == "ro" and any(_under(q, b) for b, _ in binds):
            continue  # already visible through a folder bound above it
        binds.append((q, mode))

    args = [bwrap, "--die-with-parent", "--unshare-all", "--ro-bind", "/", "/",
            "--dev", "/dev", "--proc", "/proc"]
    for node in gpu_nodes():
        args += ["--dev-bind", node, node]
    args += ["--size", str(lim.tmp_mb * MIB), "--tmpfs", "/dev/shm"]
    for h in hidden:
        args += ["--size", str(lim.tmp_mb * MIB), "--tmpfs", h]
    for q, mode in binds:
        args += ["--bind" if mode == "rw" else "--ro-bind", os.path.realpath(q), q]
    if cwd:
        args += ["--chdir", _abs(cwd)]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    return Launch(argv=[*args, "--", *argv], env=env, info_fd=info_fd, binds=binds)


def pid_limit_command(child_pid: int, processes: int) -> list[str] | None:
    """A command that caps the number of pids in the sandbox's pid namespace (Linux 6.14+
    keeps ``pid_max`` per namespace; it binds root too, which RLIMIT_NPROC does not)."""
    nsenter = shutil.which("nsenter")
    if nsenter is None:
        return None
    user = [] if os.geteuid() == 0 else ["--user", "--preserve-credentials"]
    value = processes + PID_RESERVED
    return [nsenter, f"--target={child_pid}", *user, "--pid", "--", "/bin/sh", "-c",
            f"echo {value} > /proc/sys/kernel/pid_max && cat /proc/sys/kernel/pid_max"]


def count_processes(child_pid: int) -> int | None:
    """Processes in a sandbox's pid namespace, seen from outside through its /proc."""
    try:
        return sum(1 for d in os.listdir(f"/proc/{child_pid}/root/proc") if d.isdigit())
    except OSError:
        return None

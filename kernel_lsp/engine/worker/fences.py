"""The sandbox seen from inside the Worker: apply its limits at start, and name the fence a
candidate hit in one sentence (the caller's half, which wraps the Worker in bubblewrap, is
caller/sandbox.py; the limits arrive as JSON in $KERNEL_LSP_SANDBOX). Standard library only."""

from __future__ import annotations

import errno
import json
import logging
import os
from typing import Any

from kernel_lsp.engine.protocol import SANDBOX_ENV as ENV
from kernel_lsp.engine.protocol import SANDBOX_VIOLATION as VIOLATION  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)
MIB = 1024 * 1024


def inside() -> dict[str, Any] | None:
    """This process's sandbox limits when it is a sandboxed Worker."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def apply_limits() -> dict[str, Any] | None:
    """Set the resource limits (soft and hard: a candidate cannot raise them again)."""
    conf = inside()
    if conf is None:
        return None
    import resource
    import signal

    def cap(which: int, value: int) -> None:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            log.debug("cannot set rlimit %s", which, exc_info=True)

    cap(resource.RLIMIT_CORE, 0)
    if conf.get("file_mb"):
        cap(resource.RLIMIT_FSIZE, int(conf["file_mb"]) * MIB)
        # EFBIG ("File too large") instead of death by SIGXFSZ: the Evaluation can say why.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if conf.get("processes") and _kernel() >= (5, 14):
        # Binds non-root users, counted in the sandbox's own user namespace since 5.14 (before,
        # it counted every process of the user: a browser's threads would starve the Worker).
        # Root is bound by the pid namespace's pid_max instead (process.py).
        cap(resource.RLIMIT_NPROC, int(conf["processes"]))
    if conf.get("address_space_mb"):
        cap(resource.RLIMIT_AS, int(conf["address_space_mb"]) * MIB)
    return conf


def _kernel() -> tuple[int, int]:
    import platform

    try:
        major, minor = platform.release().split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    except ValueError:
        return (0, 0)


def _count_tasks() -> int:
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                n += len(os.listdir(f"/proc/{d}/task"))
            except OSError:
                n += 1
    return n


def explain(text: str, conf: dict[str, Any] | None = None) -> str | None:
    """The fence a failure message shows the candidate hit, in one sentence; None if none."""
    conf = conf if conf is not None else inside()
    if conf is None or not text:
        return None
    low = text.lower()
    if f"[errno {errno.EAGAIN}]" in low or "resource temporarily unavailable" in low \
            or "can't start new thread" in low:
        return f"the candidate exceeded the process limit ({conf.get('processes')})"
    if f"[errno {errno.EFBIG}]" in low or "file too large" in low:
        return f"the candidate exceeded the file size limit ({conf.get('file_mb')} MiB)"
    if f"[errno {errno.ENOSPC}]" in low or "no space left on device" in low:
        return f"the candidate filled its scratch space (/tmp holds {conf.get('tmp_mb')} MiB)"
    if f"[errno {errno.EROFS}]" in low or "read-only file system" in low:
        return "the candidate tried to write outside its scratch folder (/tmp) and the build cache"
    net = (errno.ENETUNREACH, errno.ECONNREFUSED, errno.EADDRNOTAVAIL, errno.EHOSTUNREACH)
    if any(f"[errno {e}]" in low for e in net) or "name or service not known" in low \
            or "temporary failure in name resolution" in low or "network is unreachable" in low:
        return "the candidate tried to use the network, which the sandbox blocks"
    home = str(conf.get("home") or "")
    if home and home != "/" and ("no such file" in low or "[errno 2]" in low) and home.lower() + "/" in low:
        return f"the candidate tried to read the home folder ({home}), which the sandbox hides"
    return None


def process_limit_hit() -> bool:
    """Inside a sandboxed Worker: are (nearly) all the allowed pids in use?"""
    conf = inside()
    if not conf or not conf.get("processes"):
        return False
    try:
        return _count_tasks() >= 0.8 * int(conf["processes"])
    except OSError:
        return False

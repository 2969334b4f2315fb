"""The fast build's objects, kept by content hash, so that a save recompiles only the unit it changed.

A kernel-body edit changes the device unit only: the host unit and ``main.cpp`` come out the same
text, so their objects (2-5 s of g++ each against torch's headers) are taken from here. The key of
an object is everything that decides it: the unit's text, the compile command (flags, include paths,
the precompiled header, the target arch), the compilers (path, size, mtime), torch's build identity
and the contents of the user's headers the unit includes.

The extension's name (``TORCH_EXTENSION_NAME``, which carries the candidate's hash) is left out of
the key when the unit does not depend on it, or only through one ``PYBIND11_MODULE``: another
candidate's object then serves, its ``PyInit_<name>`` renamed (objcopy). pybind11 3 creates the
module with multi-phase init, which names the module from the import spec, so a renamed object is
the module torch would have built; with an older pybind11 the name stays in the key.

A host unit whose text changed only in its layout (a kernel's body grew by a line: the host unit
keeps the file's line numbers, so its blank lines moved) is also found by its preprocessed text:
g++ -E against the same precompiled header (about 0.1 s) gives the tokens the compiler sees, with
every ``__LINE__`` (``TORCH_CHECK`` has one) already a number, so two texts with the same
preprocessed tokens make the same object. Only objects compiled without a word from the compiler
are taken this way (a kept warning would name the old lines).

Safe across processes (build pool slots, several editors): one lock per key, held while that unit
compiles; objects enter the cache by rename, complete or not at all. A compiler error (g++ exits 1,
nvcc 2) is kept too: the same text fails the same way, and replaying it sends a unit that needs more
than the light torch header straight to the full one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.engine.worker.build.cache import cache_root, file_lock, tool_id
from kernel_lsp.toolchain import nvcc_parallel

VERSION = "units-v1"
OBJECT = "unit.o"
META = "meta.json"
FAILED = "failed.json"
_NAME_DEF = "#define TORCH_EXTENSION_NAME "
_MODULE = re.compile(r"\bPYBIND11_MODULE\s*\(\s*TORCH_EXTENSION_NAME\s*,")


@dataclass(frozen=True)
class UnitContext:
    """What besides its text and command a unit's object depends on."""

    ext_name: str = ""                      # the TORCH_EXTENSION_NAME its text defines first
    headers: tuple[tuple[str, str], ...] = ()  # the user's headers it includes: (path, sha256)
    headers_use_name: bool = False          # one of them says TORCH_EXTENSION_NAME


def units_root() -> Path:
    """<build cache>/units: one folder per object key."""
    return cache_root() / "units"


@functools.cache
def pybind11_major(includes: tuple[str, ...]) -> int:
    """PYBIND11_VERSION_MAJOR of the pybind11 that torch ships (0 when not found)."""
    for d in includes:
        with contextlib.suppress(OSError):
            found = re.search(r"#\s*define\s+PYBIND11_VERSION_MAJOR\s+(\d+)",
                              (Path(d) / "pybind11" / "detail" / "common.h").read_text(errors="replace"))
            if found:
                return int(found.group(1))
    return 0


def name_mode(text: str, ctx: UnitContext, pybind_major: int) -> tuple[str, str]:
    """(the text for the key, how the object depends on the extension's name):
    "free" (not at all), "module" (its PYBIND11_MODULE only: renamed on reuse), "named" (otherwise:
    the name is in the key)."""
    define = f"{_NAME_DEF}{ctx.ext_name}\n"
    if not ctx.ext_name or not text.startswith(define):
        return text, "named"
    rest = text[len(define):]
    if re.search(rf"\b{re.escape(ctx.ext_name)}\b", rest) or ctx.headers_use_name:
        return text, "named"
    uses = rest.count("TORCH_EXTENSION_NAME")
    neutral = f"{_NAME_DEF}<extension name>\n" + rest
    if uses == 0:
        return neutral, "free"
    if uses == 1 and _MODULE.search(rest) and pybind_major >= 3:
        return neutral, "module"
    return text, "named"


def unit_key(text: str, cmd: list[str], identity: str, ctx: UnitContext, pybind_major: int) -> tuple[str, str]:
    """(key, name mode) of the object ``cmd`` makes from ``text``."""
    keyed, mode = name_mode(text, ctx, pybind_major)
    tools = [tool_id(cmd[0]), tool_id("g++"), tool_id("gcc")]  # nvcc's host compiler too
    material = json.dumps([VERSION, keyed, cmd, identity, tools, list(ctx.headers), mode])
    return hashlib.sha256(material.encode()).hexdigest()[:32], mode


def preprocessed_key(cmd: list[str], build_dir: Path, base: str, ctx: UnitContext, mode: str,
                     timeout: float = 60.0) -> str | None:
    """The key of a g++ unit by its preprocessed tokens (blank lines dropped), or None where there is
    none: not a g++ compile against a precompiled header, or the preprocessor failed."""
    if "-include" not in cmd or "-c" not in cmd or cmd[-2] != "-o" or "nvcc" in os.path.basename(cmd[0]):
        return None
    pp = [("-E" if a == "-c" else a) for a in cmd[:-2]]
    pp[1:1] = ["-P", "-fpch-preprocess"]  # the header's macros stay known: TORCH_CHECK expands
    try:
        proc = subprocess.run(pp, cwd=build_dir, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0 or not proc.stdout:
        return None
    tokens = "\n".join(ln for ln in proc.stdout.splitlines() if ln.strip())
    if mode == "module" and ctx.ext_name:
        tokens = tokens.replace(ctx.ext_name, "<extension name>")  # PyInit_<name>: renamed on reuse
    material = json.dumps([VERSION, "preprocessed", tokens, base, mode])
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def compile_all(jobs: dict[str, list[str]], build_dir: Path, timeout: float, res: Any, identity: str,
                ctx: dict[str, UnitContext], includes: tuple[str, ...] = ()) -> dict[str, tuple[int, str, float]]:
    """Each unit's object in ``build_dir`` (``cmd[-1]``, compiled from ``cmd[-3]`` written there),
    from the cache when its key is there, else compiled (all at once) and kept;
    {step: (returncode, output, seconds compiling)}. ``res.compiled`` / ``res.reused`` say which."""
    major = pybind11_major(tuple(includes))

    def one(step: str) -> tuple[int, str, float]:
        return _one(step, jobs[step], build_dir, timeout, res, identity, ctx.get(step, UnitContext()), major)

    if not jobs:
        return {}
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        return dict(zip(jobs, pool.map(one, list(jobs))))


def _one(step: str, cmd: list[str], build_dir: Path, timeout: float, res: Any, identity: str, ctx: UnitContext,
         major: int) -> tuple[int, str, float]:
    out = build_dir / cmd[-1]
    try:
        text = (build_dir / cmd[-3]).read_text()
    except OSError as exc:
        return 127, f"{cmd[-3]}: {exc}", 0.0
    key, mode = unit_key(text, cmd, identity, ctx, major)
    entry = units_root() / key
    with file_lock(entry / ".lock"):
        found = _reuse(entry, out, ctx.ext_name, mode)
        if found is not None:
            res.reused.append(step)
            return found
        with contextlib.suppress(FileNotFoundError):
            out.unlink()  # never leave an older object where this compile failed
        t0 = time.perf_counter()
        # The command, identity, tools and headers of the text key, not the text: the tokens stand for it.
        pp_key = preprocessed_key(cmd, build_dir, unit_key("", cmd, identity, ctx, major)[0], ctx, mode, timeout)
        if pp_key is not None:
            pp_entry = units_root() / pp_key
            found = _reuse(pp_entry, out, ctx.ext_name, mode, quiet_only=True)
            if found is not None:
                res.reused.append(step)
                res.steps[f"{step}_preprocess"] = time.perf_counter() - t0
                # The text's own key next time (its meta as if compiled from this text).
                _keep(entry, out, {**_meta(pp_entry), "name": ctx.ext_name, "by": "text"})
                return found
        res.compiled.append(step)
        try:
            code, log = nvcc_parallel.run(cmd, build_dir, timeout)  # an nvcc -c: its two front ends at once
        except subprocess.TimeoutExpired:
            return 124, f"{step} ran past {timeout:.0f} s", time.perf_counter() - t0
        except OSError as exc:
            return 127, f"{cmd[0]}: {exc}", 0.0
        secs = time.perf_counter() - t0
        if code == 0:
            meta = {"name": ctx.ext_name, "log": log, "seconds": round(secs, 3), "step": step}
            _keep(entry, out, meta)
            if pp_key is not None and not log.strip():
                _keep(units_root() / pp_key, out, {**meta, "by": "tokens"})
        elif 0 < code < 124 and "error" in log.lower():  # the compiler's verdict, not a kill
            _write(entry / FAILED, json.dumps({"log": log}))
        return code, log, secs


def _meta(entry: Path) -> dict[str, Any]:
    try:
        got = json.loads((entry / META).read_text())
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def _reuse(entry: Path, out: Path, name: str, mode: str, quiet_only: bool = False) -> tuple[int, str, float] | None:
    failed = entry / FAILED
    if failed.exists() and not quiet_only:
        with contextlib.suppress(OSError, ValueError):
            return 1, str(json.loads(failed.read_text()).get("log", "")), 0.0
    obj = entry / OBJECT
    if not obj.exists():
        return None
    meta = _meta(entry)
    if not meta:  # unreadable: compiled again
        return None
    if quiet_only and str(meta.get("log") or "").strip():
        return None  # its warnings name the lines of the text it was compiled from
    was = str(meta.get("name") or "")
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        if mode == "module" and was and was != name:
            # Another candidate's module: the same object, its entry point under this extension's name.
            objcopy = shutil.which("objcopy")
            if objcopy is None:
                return None
            proc = subprocess.run([objcopy, "--redefine-sym", f"PyInit_{was}=PyInit_{name}", str(obj), str(tmp)],
                                  capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                return None
        else:
            shutil.copyfile(obj, tmp)  # a copy: a later compile in the build folder must not write the cache's
        os.replace(tmp, out)
    except (OSError, subprocess.SubprocessError):
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return 0, str(meta.get("log") or ""), 0.0


def _keep(entry: Path, out: Path, meta: dict[str, Any]) -> None:
    """Put a fresh object in the cache (meta first: an object is only seen with its meta)."""
    with contextlib.suppress(OSError):
        entry.mkdir(parents=True, exist_ok=True)
        _write(entry / META, json.dumps(meta))
        tmp = entry / f"{OBJECT}.{os.getpid()}.tmp"
        shutil.copyfile(out, tmp)
        os.replace(tmp, entry / OBJECT)


def _write(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

"""Builds on a Ray cluster, shared between nodes by content hash (the Ray tasks of ray_executor.py).

A build runs as a Ray CPU task in a fresh build Worker whose cache is a private folder; the
files a later load needs travel through Ray's object store, and the GPU actor adds them to its
node's build cache (where the sandbox lets its Worker write builds) under the names
worker/build/build.py gives them, so its Worker's load is a cache hit. Standard library only at
import.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from kernel_lsp.model import CompileResult

# The files a later load needs (worker/build/build.py's layout): an extern "C" library and its report,
# a torch extension's .so and its done marker. Object files and ninja state stay behind.
_KEEP = re.compile(r"^(so/[^/]+\.(so|json)|ext/[^/]+/[^/]+\.so|ext/[^/]+/\.kernel-lsp-done)$")


def pack_artefact(root: Path) -> bytes | None:
    buf = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and _KEEP.match(rel):
                tar.add(str(path), arcname=rel)
                count += 1
    return buf.getvalue() if count else None


def unpack_artefact(blob: bytes | None, root: Path | None = None) -> int:
    """Add the artefact's files to this node's build cache; files there already stay. Each
    file is written under a temporary name and renamed; libraries before their markers, so
    a reader never sees a marker without its library."""
    if not blob:
        return 0
    if root is None:
        from kernel_lsp.engine.caller.sandbox import cache_paths  # noqa: PLC0415

        # The folder this node's Workers build into (worker/build/cache.py resolves the same one).
        root = Path(cache_paths(dict(os.environ))["kernel-lsp"])
        root.mkdir(parents=True, exist_ok=True)
    written = 0
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and _KEEP.match(m.name)]
        members.sort(key=lambda m: (not m.name.endswith(".so"), m.name))
        for m in members:
            dest = root / m.name
            if dest.exists():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            if src is None:
                continue
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as fh:
                shutil.copyfileobj(src, fh)
            os.chmod(tmp, 0o755 if m.name.endswith(".so") else 0o644)
            os.replace(tmp, dest)
            written += 1
    return written


def warm_builder() -> int:
    """A Ray CPU task that only starts a worker process with what a build imports, so that the
    first real builds find one idle (ray_executor.RayExecutor._warm_builders)."""
    from kernel_lsp.engine.caller import pool  # noqa: F401, PLC0415

    return os.getpid()


def build_in_cluster(kind: str, source: str, filename: str, options: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
    """A Ray CPU task: build one Candidate in a fresh build Worker whose cache is a private
    folder, and return (CompileResult, the files a GPU node needs)."""
    from kernel_lsp.engine.caller.pool import BuildPool  # noqa: PLC0415

    tmp = Path(tempfile.mkdtemp(prefix="kernel-lsp-build-"))
    try:
        async def go() -> CompileResult:
            pool = BuildPool(size=1, env={"KERNEL_LSP_CACHE": str(tmp)})
            try:
                return await pool.build(kind, source, filename, options)
            finally:
                await pool.aclose()

        result = asyncio.run(go())
        return result.to_dict(), (pack_artefact(tmp) if result.ok else None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

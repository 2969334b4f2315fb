#!/usr/bin/env bash
# Prepare .whl/ (git-ignored) so the device machine (Python 3.12, manylinux x86_64, which lacks
# Ray) can install Ray: one run there carries at most 64 MiB, and Ray's wheel is about 79 MB.
# Ray is repacked without ray/jars/ (the Java worker, about 32 MB, unused from Python), its
# RECORD rewritten to match; beside it the four dependencies the device image lacks.
#   bash benchmarks/ray_wheels.sh [OUT_DIR]      (default .whl; RAY_VERSION=2.60.0)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.whl}
VERSION=${RAY_VERSION:-2.60.0}
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$OUT"
platforms=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
"$PY" -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${platforms[@]}" --platform any -d "$tmp" \
  "ray==$VERSION" jsonschema jsonschema-specifications referencing rpds-py
rm -f "$OUT"/ray-*.whl
"$PY" - "$tmp" "$OUT" <<'PYEOF'
import base64, hashlib, shutil, sys, zipfile
from pathlib import Path

src, out = Path(sys.argv[1]), Path(sys.argv[2])
for whl in sorted(src.glob("*.whl")):
    if not whl.name.startswith("ray-"):
        shutil.copy2(whl, out / whl.name)
        continue
    dest = out / whl.name
    with zipfile.ZipFile(whl) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        kept = [i for i in zin.infolist() if not i.filename.startswith("ray/jars/") and i.filename != record_name]
        rows = []
        for info in kept:
            data = zin.read(info.filename)
            zout.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{info.filename},sha256={digest},{len(data)}")
        rows.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(rows) + "\n")
    print(f"{whl.name}: {whl.stat().st_size / 1e6:.1f} MB -> {dest.stat().st_size / 1e6:.1f} MB without ray/jars/")
total = sum(p.stat().st_size for p in out.glob("*.whl"))
print(f"{out}: {total / 2**20:.1f} MiB of wheels")
PYEOF

"""The editor loop in seconds: save -> a measured code lens, as a user meets it (issue 21).

A plain LSP client (JSON-RPC over stdio, no pygls: the GPU machine needs only the server's own
packages) drives a real `kernel-lsp serve` with `on_save = ["compile", "verify", "bench"]`, and
times, from `didSave` to the lens that shows the numbers of that version:

  fresh      the first save on a fresh machine (every cache folder new and empty)
  comment    a save that only adds a comment (the same kernel: kept baselines)
  body       a save after editing the kernel's body (saved at once: the build starts with the save)
  body, paused  another body edit, saved 1 s after the last keystroke (built while typing)
  new file   the first save of a second file of a known kind (new baselines)
  layernorm  the first save of a new file at KernelBench's LayerNorm sizes (issue 33: <= 10 s)
  known task the first save of a new kernel for the first file's Task (its baselines kept)
  second     "Benchmark" of the same candidate again (the lens command)
  cli        `kernel-lsp bench --json --timings` of the cached candidate (cached build, kept
             baselines), with its phase breakdown: it starts its GPU Worker and keeps it
  cli kept   the same command again: it reuses the kept Worker (--keep-worker)
  fresh+30s  the first save on another fresh machine, 30 s after the server started

and checks that the same kernel measured three times (its first save, the comment-only save,
the command line) gives the same ratios against eager and torch.compile within their spreads.
Ratios come from the workspace store the server and the CLI write (exact numbers, not lens text).

  GPU (the H200; about 4-6 minutes):  python benchmarks/editor_loop.py
  CPU smoke (compile+verify+bench of a PyTorch task on the CPU, 1 s instead of 30 s; the test
  tests/benchmarks/test_editor_loop.py runs it):  python benchmarks/editor_loop.py --smoke

Prints a table and writes benchmarks/results/editor_loop.{json,md} (--out-dir elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

from kernel_lsp.cli.numbers import ratio_spread  # noqa: E402  (stdlib + model only, as the store)
from kernel_lsp.store import Store  # noqa: E402  (stdlib + model only: fine without LSP packages)

# -- the tasks --------------------------------------------------------------------------------------

GELU = r'''import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline


class Model(nn.Module):
    """minGPT's NewGELU, as KernelBench has it."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


batch_size = 2000
dim = 2000


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


gelu_source = """
#include <torch/extension.h>

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    }
}

torch::Tensor gelu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    gelu_kernel<<<(n + 255) / 256, 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

gelu = load_inline(name="editor_loop_gelu", cpp_sources="torch::Tensor gelu_forward(torch::Tensor x);",
                   cuda_sources=gelu_source, functions=["gelu_forward"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return gelu.gelu_forward(x)
'''
# A body edit: the same arithmetic written differently (the kernel's text changes, its work does not).
GELU_BODY = ("        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));",
             "        float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);\n"
             "        y[i] = 0.5f * v * (1.0f + tanhf(u));")

RELU = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4096, 4096)]


def get_init_inputs():
    return []


relu_source = """
#include <torch/extension.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}

torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

relu = load_inline(name="editor_loop_relu", cpp_sources="torch::Tensor relu_forward(torch::Tensor x);",
                   cuda_sources=relu_source, functions=["relu_forward"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu.relu_forward(x)
'''

# A new file at KernelBench's LayerNorm sizes (level 1 problem 40: 16 x 64 x 256 x 256, 256 MiB in):
# a two-kernel load_inline LayerNorm (each row's sum and sum of squares in double, then x_hat * w + b).
LAYERNORM = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline


class Model(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x):
        return self.ln(x)


batch_size = 16
features = 64
dim1 = 256
dim2 = 256


def get_inputs():
    return [torch.randn(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return [(features, dim1, dim2)]


ln_source = """
#include <torch/extension.h>

__global__ void ln_stats(const float* __restrict__ x, double* __restrict__ stats, long n) {
    const float* row = x + (long)blockIdx.y * n;
    double s = 0.0, q = 0.0;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        double v = row[i];
        s += v;
        q += v * v;
    }
    __shared__ double ss[256], qq[256];
    ss[threadIdx.x] = s;
    qq[threadIdx.x] = q;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) {
            ss[threadIdx.x] += ss[threadIdx.x + k];
            qq[threadIdx.x] += qq[threadIdx.x + k];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        atomicAdd(&stats[2 * blockIdx.y], ss[0]);
        atomicAdd(&stats[2 * blockIdx.y + 1], qq[0]);
    }
}

__global__ void ln_apply(const float* __restrict__ x, const double* __restrict__ stats,
                         const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ y,
                         long n, long total, float eps) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        long r = i / n, c = i - r * n;
        double mean = stats[2 * r] / n;
        double var = stats[2 * r + 1] / n - mean * mean;
        float rstd = (float)(1.0 / sqrt(var + (double)eps));
        y[i] = ((x[i] - (float)mean) * rstd) * w[c] + b[c];
    }
}

torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) {
    auto xc = x.contiguous();
    long n = w.numel();
    long rows = xc.numel() / n;
    auto stats = torch::zeros({rows, 2}, xc.options().dtype(torch::kFloat64));
    auto y = torch::empty_like(xc);
    ln_stats<<<dim3(256, rows), 256>>>(xc.data_ptr<float>(), stats.data_ptr<double>(), n);
    ln_apply<<<4096, 256>>>(xc.data_ptr<float>(), stats.data_ptr<double>(), w.contiguous().data_ptr<float>(),
                            b.contiguous().data_ptr<float>(), y.data_ptr<float>(), n, xc.numel(), (float)eps);
    return y;
}
"""

ln = load_inline(name="editor_loop_layernorm",
                 cpp_sources="torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps);",
                 cuda_sources=ln_source, functions=["layer_norm_forward"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x):
        return ln.layer_norm_forward(x, self.ln.weight, self.ln.bias, self.ln.eps)
'''
# The CPU smoke mode's stand-ins: PyTorch candidates that run on a CPU (no kernel to build).
ROWSUM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.sum(dim=1)


def get_inputs():
    return [torch.randn(256, 512)]


def get_init_inputs():
    return []


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        ones = torch.ones(x.shape[1], dtype=x.dtype)
        return torch.mv(x, ones)
'''
ROWSUM_BODY = ("        return torch.mv(x, ones)", "        out = torch.mv(x, ones)\n        return out")
ROWSUM_BODY_2 = ("        return out", "        return out.contiguous()")
ROWMAX = ROWSUM.replace("return x.sum(dim=1)", "return x.amax(dim=1)").replace(
    "        ones = torch.ones(x.shape[1], dtype=x.dtype)\n        return torch.mv(x, ones)",
    "        return torch.max(x, dim=1).values")

# The LayerNorm step's stand-in: the same Task at a CPU's size, a PyTorch candidate (nothing to build).
LAYERNORM_SMOKE = LAYERNORM[:LAYERNORM.index("ln_source = ")].replace(
    "from torch.utils.cpp_extension import load_inline\n", "").replace(
    "batch_size = 16\nfeatures = 64\ndim1 = 256\ndim2 = 256", "batch_size = 4\nfeatures = 8\ndim1 = 16\ndim2 = 16") + '''class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x):
        dims = tuple(range(1, x.dim()))
        mean = x.mean(dim=dims, keepdim=True)
        var = x.var(dim=dims, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.ln.eps) * self.ln.weight + self.ln.bias
'''

# A new file for a Task already measured (the same reference as GELU, so its baselines are kept):
# another kernel, a grid-stride loop, built from nothing.
GELU_B = GELU.replace("editor_loop_gelu", "editor_loop_gelu_b").replace(
    "    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) {",
    "    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {"
).replace("gelu_kernel<<<(n + 255) / 256, 256>>>", "gelu_kernel<<<1056, 256>>>")
ROWSUM_B = ROWSUM.replace("        ones = torch.ones(x.shape[1], dtype=x.dtype)\n        return torch.mv(x, ones)",
                          "        return torch.einsum('ij->i', x)")
GELU_BODY_2 = ("        y[i] = 0.5f * v * (1.0f + tanhf(u));",
               "        float t = tanhf(u);\n        y[i] = 0.5f * v * (1.0f + t);")
# A user who stops typing and then saves: the server builds the text during this pause
# (build_while_typing), so the save finds its build done or under way.
PAUSE_S = 1.0

COMMENT = ("class ModelNew(nn.Module):", "# kernel-lsp editor loop: a comment-only edit\nclass ModelNew(nn.Module):")


# -- a plain LSP client -----------------------------------------------------------------------------

class Client:
    """JSON-RPC over the server's stdin/stdout; answers the requests a server sends an editor."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.next_id = 0
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(cls, env: dict[str, str], cwd: str, log: Path) -> "Client":
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kernel_lsp.cli", "serve", "--log-file", str(log), "--log-level", "INFO",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            env=env, cwd=cwd)
        return cls(proc)

    async def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message).encode("utf-8")
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await self.proc.stdin.drain()

    async def request(self, method: str, params: Any, timeout: float = 60.0) -> Any:
        self.next_id += 1
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self._send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        return await asyncio.wait_for(fut, timeout)

    async def notify(self, method: str, params: Any) -> None:
        await self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            length = None
            while True:
                line = await out.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length is None:
                continue
            message = json.loads(await out.readexactly(length))
            if "method" in message and "id" in message:  # a request from the server
                await self._send({"jsonrpc": "2.0", "id": message["id"], "result": _answer(message)})
            elif "id" in message and message["id"] in self.pending:
                fut = self.pending.pop(message["id"])
                if not fut.done():
                    if "error" in message:
                        fut.set_exception(RuntimeError(str(message["error"])))
                    else:
                        fut.set_result(message.get("result"))

    async def close(self) -> None:
        try:
            await self.request("shutdown", None, timeout=30)
            await self.notify("exit", None)
            await asyncio.wait_for(self.proc.wait(), 30)
        except Exception:  # noqa: BLE001 - a server that does not stop is ended
            if self.proc.returncode is None:
                self.proc.kill()
                await self.proc.wait()
        self.reader.cancel()


def _answer(message: dict[str, Any]) -> Any:
    method = message.get("method")
    if method == "workspace/configuration":
        return [None for _ in (message.get("params") or {}).get("items", [])]
    if method == "workspace/applyEdit":
        return {"applied": False}
    return None  # registerCapability, workDoneProgress/create, codeLens/refresh, showMessageRequest


async def open_session(env: dict[str, str], root: Path, log: Path) -> Client:
    client = await Client.start(env, str(root), log)
    await client.request("initialize", {
        "processId": os.getpid(), "rootUri": root.as_uri(),
        "workspaceFolders": [{"uri": root.as_uri(), "name": "loop"}],
        "capabilities": {"workspace": {"codeLens": {"refreshSupport": True}, "configuration": True},
                         "window": {"workDoneProgress": True},
                         "textDocument": {"codeLens": {}, "hover": {"contentFormat": ["markdown"]}}},
        "initializationOptions": {"onSave": ["compile", "verify", "bench"], "timeout": 600},
    }, timeout=120)
    await client.notify("initialized", {})
    return client


async def lens_for(client: Client, uri: str, version: int, timeout: float) -> dict[str, Any]:
    """Poll the lenses until the first one shows numbers measured on `version`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lenses = await client.request("textDocument/codeLens", {"textDocument": {"uri": uri}}) or []
        cmd = (lenses[0].get("command") or {}) if lenses else {}
        title, tip = cmd.get("title", ""), cmd.get("tooltip") or ""
        if title not in ("", "measuring…", "not measured yet") and f"measured on version {version}" in tip \
                and not title.startswith("edited since"):
            return cmd
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no measured lens for version {version} of {uri} within {timeout:.0f} s")


async def save(client: Client, path: Path, text: str, version: int, timeout: float, first: bool,
               pause: float = 0.0) -> tuple[float, dict]:
    """Write, (open or change), wait `pause` seconds (the user stops typing, then saves), save;
    seconds from didSave to the measured lens."""
    path.write_text(text)
    uri = path.as_uri()
    if first:
        await client.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "python", "version": version, "text": text}})
    else:
        await client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                                       "contentChanges": [{"text": text}]})
        await asyncio.sleep(pause)
    t0 = time.monotonic()
    await client.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
    lens = await lens_for(client, uri, version, timeout)
    return time.monotonic() - t0, lens


# -- measurements -----------------------------------------------------------------------------------

def server_steps(log: Path, name: str, version: int) -> str | None:
    """Where the server says that save's seconds went ("measured gelu.py (version 3): compiling
    1.52 s, evaluating 2.10 s, ...; 3.70 s in all"), from its log; None when it says nothing."""
    return _logged(log, f"measured {name} (version {version}): ")


def ahead_words(log: Path, name: str, version: int) -> str | None:
    """What the server built while the user paused ("in 1.52 s: ok"), from its log."""
    return _logged(log, f"built ahead {name} (version {version}) ")


def _logged(log: Path, mark: str) -> str | None:
    """The rest of the server log's last line holding `mark`."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = [ln.split(mark, 1)[1] for ln in lines if mark in ln]
    return found[-1] if found else None


def fresh_env(cache: Path, smoke: bool) -> dict[str, str]:
    """Every cache the loop uses, in a new empty folder: a fresh machine."""
    env = dict(os.environ)
    for var, sub in (("KERNEL_LSP_CACHE", "kernel-lsp"), ("KERNEL_LSP_PCH_CACHE", "pch"),
                     ("XDG_CACHE_HOME", "xdg"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                     ("TRITON_CACHE_DIR", "triton"), ("TORCH_EXTENSIONS_DIR", "torch_extensions")):
        (cache / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(cache / sub)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if smoke:  # a busy 2-core machine times noisily: keep what it measured
        env.setdefault("KERNEL_LSP_BASELINE_KEEP_SPREAD", "1000")
    return env


def ratios(ev: Any) -> dict[str, Any]:
    """Both ratios with their spreads (a ratio is as uncertain as the noisier of its timings)."""
    b = ev.baselines or {}
    return {"verdict": ev.verdict, "time_ms": ev.time.median_ms if ev.time else None,
            "eager_ms": ev.eager.median_ms if ev.eager else None,
            "compile_ms": ev.compiled.median_ms if ev.compiled else None,
            "speedup_eager": ev.speedup_eager, "speedup_compile": ev.speedup_compile,
            "eager_spread_pct": ratio_spread(ev.time, ev.eager),
            "compile_spread_pct": ratio_spread(ev.time, ev.compiled),
            "baselines_cached": b.get("cached"), "baselines_measured_at": b.get("measured_at")}


def latest(root: Path, name: str) -> dict[str, Any]:
    with Store(root) as store:
        ev = store.latest(name)
    if ev is None:
        raise RuntimeError(f"no evaluation of {name} in the store")
    return ratios(ev)


def agree(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every pair of runs: |r1 - r2| <= r1*s1 + r2*s2 (s: the ratio's spread, a fraction), for
    both ratios. Holds only when all pairs do."""
    pairs = []
    names = list(runs)
    ok = True
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for ratio, sp in (("speedup_eager", "eager_spread_pct"), ("speedup_compile", "compile_spread_pct")):
                ra, rb = runs[a].get(ratio), runs[b].get(ratio)
                sa, sb = runs[a].get(sp), runs[b].get(sp)
                if None in (ra, rb, sa, sb):
                    pairs.append({"pair": f"{a} / {b}", "ratio": ratio, "holds": None})
                    ok = False
                    continue
                allowed = ra * sa / 100 + rb * sb / 100
                holds = abs(ra - rb) <= allowed
                ok = ok and holds
                pairs.append({"pair": f"{a} / {b}", "ratio": ratio, "a": ra, "b": rb, "diff": abs(ra - rb),
                              "allowed": allowed, "holds": holds})
    return {"holds": ok, "pairs": pairs}


# The kept Worker's idle time here: gone before the next fresh server times anything.
CLI_KEEP_S = 15.0


async def cli_bench(env: dict[str, str], root: Path, name: str) -> tuple[float, dict[str, Any]]:
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kernel_lsp.cli", "bench", name, "--json", "--timings",
        "--keep-worker", f"{CLI_KEEP_S:g}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=str(root))
    out, err = await proc.communicate()
    seconds = time.monotonic() - t0
    try:
        doc = json.loads(out)
    except ValueError:
        raise RuntimeError(f"kernel-lsp bench gave no JSON (rc {proc.returncode}): {err.decode()[-2000:]}") from None
    return seconds, doc


async def run(smoke: bool, wait_s: float, timeout: float) -> dict[str, Any]:
    first_text, body, second_text = (ROWSUM, ROWSUM_BODY, ROWMAX) if smoke else (GELU, GELU_BODY, RELU)
    body_2 = ROWSUM_BODY_2 if smoke else GELU_BODY_2
    name, second_name = ("rowsum.py", "rowmax.py") if smoke else ("gelu.py", "relu.py")
    known_text, known_name = (ROWSUM_B, "rowsum_b.py") if smoke else (GELU_B, "gelu_b.py")
    steps: list[dict[str, Any]] = []
    three: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-loop-") as tmp:
        base = Path(tmp)
        root, cache = base / "ws", base / "cache-a"
        root.mkdir()
        env = fresh_env(cache, smoke)
        task = root / name
        log_a = base / "server-a.log"
        client = await open_session(env, root, log_a)
        try:
            t, lens = await save(client, task, first_text, 1, timeout, first=True)
            steps.append({"step": "fresh", "what": "first save on a fresh machine", "seconds": t, "lens": lens["title"],
                          "server": server_steps(log_a, name, 1)})
            three["first save"] = latest(root, name)
            commented = first_text.replace(*COMMENT)
            t, lens = await save(client, task, commented, 2, timeout, first=False)
            steps.append({"step": "comment", "what": "save after a comment-only edit", "seconds": t,
                          "lens": lens["title"], "server": server_steps(log_a, name, 2)})
            three["comment-only save"] = latest(root, name)
            t, lens = await save(client, task, commented.replace(*body), 3, timeout, first=False)
            steps.append({"step": "body", "what": "save after editing the kernel's body", "seconds": t,
                          "lens": lens["title"], "baselines_cached": latest(root, name)["baselines_cached"],
                          "server": server_steps(log_a, name, 3)})
            t, lens = await save(client, task, commented.replace(*body).replace(*body_2), 4, timeout, first=False,
                                 pause=PAUSE_S)
            steps.append({"step": "body, paused", "what": f"save {PAUSE_S:g} s after the last keystroke of another "
                          "body edit (built while typing)", "seconds": t, "lens": lens["title"],
                          "baselines_cached": latest(root, name)["baselines_cached"],
                          "server": server_steps(log_a, name, 4), "built_ahead": ahead_words(log_a, name, 4)})
            t, lens = await save(client, root / second_name, second_text, 1, timeout, first=True)
            steps.append({"step": "new file", "what": "first save of a second file of a known kind", "seconds": t,
                          "lens": lens["title"], "server": server_steps(log_a, second_name, 1)})
            ln_text = LAYERNORM_SMOKE if smoke else LAYERNORM
            t, lens = await save(client, root / "layernorm.py", ln_text, 1, timeout, first=True)
            steps.append({"step": "layernorm", "what": "first save of a new file at KernelBench's LayerNorm sizes "
                          "(16 x 64 x 256 x 256; new baselines, a new build)", "seconds": t, "lens": lens["title"],
                          "server": server_steps(log_a, "layernorm.py", 1)})
            t, lens = await save(client, root / known_name, known_text, 1, timeout, first=True)
            steps.append({"step": "known task", "what": "first save of a new kernel for a Task already measured "
                          "(kept baselines)", "seconds": t, "lens": lens["title"],
                          "baselines_cached": latest(root, known_name)["baselines_cached"],
                          "server": server_steps(log_a, known_name, 1)})
            t0 = time.monotonic()
            result = await client.request("workspace/executeCommand", {
                "command": "kernel-lsp.benchmark", "arguments": [{"uri": task.as_uri()}]}, timeout=timeout)
            steps.append({"step": "second", "what": "Benchmark of the same candidate again",
                          "seconds": time.monotonic() - t0, "lens": str((result or {}).get("verdict")),
                          "baselines_cached": (result or {}).get("baselines_cached")})
        finally:
            await client.close()
        task.write_text(first_text)  # the first save's text: a cached build, kept baselines
        t, doc = await cli_bench(env, root, name)
        target = (doc.get("targets") or [{}])[0]
        steps.append({"step": "cli", "what": "kernel-lsp bench of the cached candidate (starts its Worker)",
                      "seconds": t, "lens": str(target.get("verdict")), "baselines_cached": target.get("baselines_cached"),
                      "worker": doc.get("worker"), "timings": doc.get("timings")})
        t, doc = await cli_bench(env, root, name)
        target = (doc.get("targets") or [{}])[0]
        steps.append({"step": "cli kept", "what": "kernel-lsp bench of it again (the kept Worker)", "seconds": t,
                      "lens": str(target.get("verdict")), "baselines_cached": target.get("baselines_cached"),
                      "worker": doc.get("worker"), "timings": doc.get("timings")})
        kept_since = time.monotonic()
        three["command line"] = {k: target.get(k) for k in (
            "verdict", "time_ms", "eager_ms", "compile_ms", "speedup_eager", "speedup_compile",
            "baselines_cached", "baselines_measured_at")}
        three["command line"]["eager_spread_pct"] = target.get("speedup_eager_spread_pct")
        three["command line"]["compile_spread_pct"] = target.get("speedup_compile_spread_pct")

        # Another fresh machine: the server waits `wait_s` before the first save.
        root_b, cache_b = base / "ws-b", base / "cache-b"
        root_b.mkdir()
        log_b = base / "server-b.log"
        client = await open_session(fresh_env(cache_b, smoke), root_b, log_b)
        try:
            # The kept Worker's idle time ends first (it would be another process on the GPU).
            await asyncio.sleep(max(wait_s, CLI_KEEP_S + 2.0 - (time.monotonic() - kept_since)))
            t, lens = await save(client, root_b / name, first_text, 1, timeout, first=True)
            steps.append({"step": f"fresh+{wait_s:g}s", "what": f"first save {wait_s:g} s after the server started "
                          "(fresh machine)", "seconds": t, "lens": lens["title"], "server": server_steps(log_b, name, 1)})
        finally:
            await client.close()
    return {"steps": steps, "three_ratios": {"runs": three, **agree(three)}}


def device() -> str:
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        return out.splitlines()[0] if out else "no GPU"
    except (OSError, subprocess.SubprocessError):
        return "no GPU"


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"# Editor loop ({doc['mode']})", "",
             f"{doc['device']}; {doc['host']}; Python {doc['python']}; {doc['date']}. "
             "`python benchmarks/editor_loop.py" + (" --smoke" if doc["mode"] == "cpu smoke" else "") + "`.", "",
             "| step | save to a measured lens | lens |", "| --- | ---: | --- |"]
    for s in doc["steps"]:
        lines.append(f"| {s['what']} | {s['seconds']:.1f} s | {s['lens']} |")
    t = doc["three_ratios"]
    lines += ["", f"The same kernel three times: ratios {'agree' if t['holds'] else 'DO NOT agree'} within "
              "their spreads.", "", "| run | vs eager | spread | vs torch.compile | spread | baselines |",
              "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name, r in t["runs"].items():
        lines.append(f"| {name} | {_x(r.get('speedup_eager'))} | {_pct(r.get('eager_spread_pct'))} | "
                     f"{_x(r.get('speedup_compile'))} | {_pct(r.get('compile_spread_pct'))} | "
                     f"{'kept' if r.get('baselines_cached') else 'measured'} |")
    said = [s for s in doc["steps"] if s.get("server")]
    if said:
        lines += ["", "Where each save's seconds went, as the server logged them (from the job's start):", "",
                  "| step | server |", "| --- | --- |"]
        lines += [f"| {s['what']} | {s['server']}"
                  + (f"; built while typing {s['built_ahead']}" if s.get("built_ahead") else "") + " |" for s in said]
    clis = [s for s in doc["steps"] if s["step"].startswith("cli") and s.get("timings")]
    if clis:
        lines += ["", "Where `kernel-lsp bench` of the cached candidate spends its time (the first run starts "
                  "the GPU Worker and keeps it; the second reuses it):", "",
                  "| phase | " + " | ".join(s["step"] for s in clis) + " |", "| --- |" + " ---: |" * len(clis)]
        names: list[tuple[str, bool]] = []
        for s in clis:
            for p in s["timings"]["phases"]:
                if (p["phase"], p["inside"]) not in names:
                    names.append((p["phase"], p["inside"]))
        for phase, inside in names:
            cells = []
            for s in clis:
                got = [p["seconds"] for p in s["timings"]["phases"] if (p["phase"], p["inside"]) == (phase, inside)]
                cells.append(f"{sum(got):.3f}" if got else "-")
            lines.append(f"| {('&nbsp;&nbsp;' if inside else '') + phase} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _x(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}x"


def _pct(v: Any) -> str:
    return "-" if v is None else f"±{v:.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU: PyTorch tasks instead of CUDA kernels, --wait 1")
    ap.add_argument("--wait", type=float, default=None, help="seconds before the last fresh save (default 30)")
    ap.add_argument("--timeout", type=float, default=300.0, help="bound on each step (default 300 s)")
    ap.add_argument("--out-dir", default=str(RESULTS))
    ns = ap.parse_args(argv)
    if shutil.which("nvcc") is None and not ns.smoke and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        print("editor_loop: no nvcc; run with --smoke on a machine without CUDA", file=sys.stderr)
        return 2
    wait = ns.wait if ns.wait is not None else (1.0 if ns.smoke else 30.0)
    t0 = time.monotonic()
    doc: dict[str, Any] = {"mode": "cpu smoke" if ns.smoke else "gpu", "device": device(), "host": platform.node(),
                           "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M")}
    doc.update(asyncio.run(run(ns.smoke, wait, ns.timeout)))
    doc["total_s"] = time.monotonic() - t0
    out = Path(ns.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "editor_loop_smoke" if ns.smoke else "editor_loop"
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    text = markdown(doc)
    (out / f"{stem}.md").write_text(text)
    print(text)
    print(f"({doc['total_s']:.0f} s in all; results in {out}/{stem}.json and .md)")
    return 0 if doc["three_ratios"]["holds"] else 1


if __name__ == "__main__":
    sys.exit(main())

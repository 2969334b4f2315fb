"""The Worker: one process, one GPU, one request at a time (``python -m kernel_lsp.engine.worker``).

It speaks JSON lines (``protocol.py``) on private copies of the stdin/stdout file
descriptors taken before any candidate code runs; fd 0 then reads /dev/null and
fd 1 (and ``sys.stdout``) write to stderr, so a candidate's ``print`` or a C
``printf`` lands in the stderr log the client keeps, never in the protocol.

Imports only the standard library, torch/triton (lazily), and kernel_lsp's model,
toolchain and engine modules; never pygls, tree-sitter or openai.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import io
import os
import platform
import sys
import time
from typing import Any, BinaryIO, Callable

from kernel_lsp.engine.worker.build import build
from kernel_lsp.engine.worker import early, notify
from kernel_lsp.engine import protocol
from kernel_lsp.engine.worker import fences as sandbox
from kernel_lsp.model import Candidate, Task

Handler = Callable[[dict[str, Any]], Any]


class FatalWorkerError(Exception):
    """After answering, the Worker must exit (its CUDA context is unusable)."""


def _take_channel() -> tuple[BinaryIO, BinaryIO]:
    """Move the protocol onto private fds; candidates' stdout goes to stderr."""
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb")  # buffered: a write is never partial; flushed per message
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0, closefd=False), write_through=True)
    return proto_in, proto_out


class Worker:
    def __init__(self) -> None:
        self.ops: dict[str, Handler] = {
            "ping": self.op_ping,
            "warm": self.op_warm,
            "device_info": self.op_device_info,
            "evaluate": self.op_evaluate,
            "profile": self.op_profile,
            "build": self.op_build,
            "shutdown": self.op_shutdown,
            "extract": lambda params: importlib.import_module("kernel_lsp.engine.worker.extract").worker_op(params, build),
            "prepare_reference": self.op_prepare_reference,
            "prepare_compile": self.op_prepare_compile,
            # before the GPU turn, while another process holds it: what this Task needs there
            "task_need": self.op_task_need,
            # torch.compile's output code for a Task's module (the no-LLM writer's input)
            "inductor_code": lambda params: importlib.import_module(
                "kernel_lsp.engine.worker.inductor_code").worker_op(params),
            "prepare_build": lambda params: importlib.import_module(
                "kernel_lsp.engine.worker.build.fastbuild").prepare_op(params, build),
            # a file's main.cpp (by table or signature), before its first build (its calls read, not run)
            "prebuild_binding": lambda params: importlib.import_module(
                "kernel_lsp.engine.worker.build.fastbuild").prebuild_source_op(params, build),
        }
        self.pid = os.getpid()  # a candidate's forked child must never answer on the protocol
        self.sandbox = sandbox.inside()
        self.started = time.time()
        self.preloaded: list[str] = []
        self.requests = 0
        self.stop = False
        self.fatal = False  # set when the CUDA context is unusable: answer, then exit

    # -- ops ------------------------------------------------------------------

    def op_ping(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"pid": os.getpid(), "python": sys.version.split()[0], "requests": self.requests,
                "uptime": time.time() - self.started, "preloaded": list(self.preloaded),
                "torch_imported": "torch" in sys.modules}

    def op_warm(self, params: dict[str, Any]) -> dict[str, Any]:
        """Import torch and initialize CUDA now, outside any candidate's deadline."""
        t0 = time.perf_counter()
        out: dict[str, Any] = {"torch": None, "cuda": False}
        made = early.wait()  # the driver's init begun at the start, in a thread (worker/early.py)
        if made:
            out["early_cuda"] = made
        try:
            import torch  # noqa: PLC0415
        except ImportError:
            return {**out, "seconds": time.perf_counter() - t0}
        out["torch"] = torch.__version__
        build.install_hooks()
        if torch.cuda.is_available():
            torch.cuda.init()
            torch.empty(1, device="cuda")
            torch.cuda.synchronize()
            major, minor = torch.cuda.get_device_capability()
            arch = build.device_arch(major, minor)  # sm_90a on an H200: wgmma and TMA compile
            build.configure(arch)
            out.update(cuda=True, device=torch.cuda.get_device_name(), arch=arch)
        out["seconds"] = time.perf_counter() - t0
        return out

    def op_device_info(self, params: dict[str, Any]) -> dict[str, Any]:
        run = _run_module()
        if run is not None and hasattr(run, "device_info"):
            return run.device_info()
        return _fallback_device_info()

    def op_evaluate(self, params: dict[str, Any]) -> dict[str, Any]:
        run = _run_module()
        if run is None:
            raise RuntimeError("kernel_lsp.engine.worker.run is not available in this Worker")
        task = Task.from_dict(params["task"])
        candidate = Candidate.from_dict(params["candidate"])
        checks = list(params.get("checks") or ["compile", "verify", "bench"])
        options = dict(params.get("options") or {})
        build.configure_fast_inline(options.get("fast_inline"))
        ev = run.evaluate(task, candidate, checks, options, build)
        self._forked_child_exits()  # a fork bomb's children stop here, not after the judgement
        data = ev.to_dict() if hasattr(ev, "to_dict") else dict(ev)
        self._name_fence(data)
        reason = _cuda_unhealthy(str(data.get("message", "")) + " " + str(data.get("evidence") or ""))
        if reason:
            self.stop = self.fatal = True
            data["message"] = f"{data.get('message', '')} [the Worker restarts: {reason}]".strip()
        return data

    def op_prepare_reference(self, params: dict[str, Any]) -> dict[str, Any]:
        """The reference's torch.compile, compiled ahead of its evaluation (run.prepare_reference)."""
        run = _run_module()
        if run is None or not hasattr(run, "prepare_reference"):
            return {"state": "skipped", "why": "this Worker's run module cannot"}
        options = dict(params.get("options") or {})
        build.configure_fast_inline(options.get("fast_inline"))
        result = run.prepare_reference(Task.from_dict(params["task"]), options, build)
        if _cuda_unhealthy(str(result)[:4000]):
            self.stop = self.fatal = True
        return result

    def op_task_need(self, params: dict[str, Any]) -> dict[str, Any]:
        """What the Task's evaluation needs on the GPU, from its sizes on meta (run.task_need)."""
        run = _run_module()
        if run is None or not hasattr(run, "task_need"):
            return {"why": "this Worker's run module cannot"}
        return run.task_need(Task.from_dict(params["task"]), dict(params.get("options") or {}), build)

    def op_prepare_compile(self, params: dict[str, Any]) -> dict[str, Any]:
        """torch.compile's one-time costs, now (run.prepare_compile)."""
        run = _run_module()
        if run is None or not hasattr(run, "prepare_compile"):
            return {"state": "skipped", "why": "this Worker's run module cannot"}
        return run.prepare_compile(dict(params.get("options") or {}))

    def op_profile(self, params: dict[str, Any]) -> Any:
        run = _run_module()
        if run is None:
            raise RuntimeError("kernel_lsp.engine.worker.run is not available in this Worker")
        task = Task.from_dict(params["task"])
        candidate = Candidate.from_dict(params["candidate"]) if params.get("candidate") else None
        options = dict(params.get("options") or {})
        if hasattr(run, "profile"):
            result = run.profile(task, candidate, options, build)
        else:
            cand = candidate or Candidate(source=task.reference_source, kind="python", origin="reference")
            ev = run.evaluate(task, cand, ["compile", "profile"], options, build)
            result = ev.profile or {"verdict": ev.verdict, "message": ev.message}
        if hasattr(result, "to_dict"):
            result = result.to_dict()
        if _cuda_unhealthy(str(result)[:4000]):
            self.stop = self.fatal = True
        return result

    def op_build(self, params: dict[str, Any]) -> dict[str, Any]:
        """Build without running (the CPU pool): the cache then has it."""
        kind = params.get("kind", "python")
        source, filename = params["source"], params.get("filename") or "<candidate>"
        options = params.get("options") or {}
        build.configure_fast_inline(options.get("fast_inline"))
        if kind == "cuda":
            _, result = build.build_cuda(source, filename, options)
        else:
            if options.get("arch"):
                build.configure(str(options["arch"]))  # load_inline's key: the GPU Worker's arch
            result = build.build_python(source, filename)
        return result.to_dict()

    def _name_fence(self, data: dict[str, Any]) -> None:
        """A failed Evaluation that ran into a sandbox limit says so (and this Worker goes:
        a fork bomb's children or a full /tmp must not outlive the request)."""
        if self.sandbox is None or data.get("verdict") in ("correct", None):
            return
        compile_log = (data.get("compile") or {}).get("log", "") if isinstance(data.get("compile"), dict) else ""
        text = f"{data.get('message', '')} {data.get('evidence') or ''} {compile_log}"
        fence = sandbox.explain(text, self.sandbox)
        if fence is None and sandbox.process_limit_hit():
            fence = f"the candidate exceeded the process limit ({self.sandbox.get('processes')})"
        if fence:
            data["verdict"], data["correct"] = sandbox.VIOLATION, None
            data["message"] = f"{fence}: {data.get('message', '')}".strip()[:4000]
            self.stop = self.fatal = True

    def op_shutdown(self, params: dict[str, Any]) -> dict[str, Any]:
        self.stop = True
        return {"bye": True}

    # -- loop -----------------------------------------------------------------

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        req_id = message.get("id")
        op = message.get("op")
        handler = self.ops.get(str(op))
        self.requests += 1
        if handler is None:
            return {"id": req_id, "error": {"type": "UnknownOp", "message": f"unknown op {op!r}", "traceback": ""}}
        try:
            result = handler(message.get("params") or {})
            self._forked_child_exits()
            return {"id": req_id, "result": result, "fatal": self.fatal}
        except FatalWorkerError as exc:
            self._forked_child_exits()
            self.stop = True
            return {"id": req_id, "error": protocol.error_payload(exc), "fatal": True}
        except BaseException as exc:  # noqa: BLE001 - every fault becomes an answer
            self._forked_child_exits()
            if isinstance(exc, KeyboardInterrupt):
                raise
            error = protocol.error_payload(exc)
            fatal = _cuda_unhealthy(str(exc)) is not None
            fence = sandbox.explain(f"{error['message']} {error['traceback'][-4000:]}", self.sandbox) \
                if self.sandbox is not None else None
            if fence:
                error["fence"] = fence
                fatal = True
            if fatal:
                self.stop = True
            return {"id": req_id, "error": error, "fatal": fatal}

    def _forked_child_exits(self) -> None:
        if os.getpid() != self.pid:
            os._exit(0)


def _partial_sender(proto_out: BinaryIO, message: dict[str, Any]) -> Any:
    """Writes the request's partial results on the protocol, when its options ask for them
    (protocol.EARLY_RESULT, protocol.YIELD_TURNS); None otherwise: a caller that did not ask
    never reads one."""
    options = _options(message)
    if options.get(protocol.EARLY_RESULT) is not True and options.get(protocol.YIELD_TURNS) is not True:
        return None
    req_id = message.get("id")

    def send(kind: str, data: dict[str, Any]) -> None:
        proto_out.write(protocol.encode(protocol.partial(req_id, kind, data)))
        proto_out.flush()
    return send


def _options(message: dict[str, Any]) -> dict[str, Any]:
    params = message.get("params") if isinstance(message.get("params"), dict) else {}
    return params.get("options") if isinstance(params.get("options"), dict) else {}


def _turn_reader(proto_in: BinaryIO, message: dict[str, Any]) -> Any:
    """The reader of the caller's continue lines at turn points (notify.turn_point), when the
    request asked for them (protocol.YIELD_TURNS); None otherwise."""
    return proto_in.readline if _options(message).get(protocol.YIELD_TURNS) is True else None


def _cuda_unhealthy(text: str) -> str | None:
    """A sticky CUDA error (illegal address...) poisons the context: this Worker must go."""
    if protocol.is_sticky_cuda_error(text):
        return "a sticky CUDA error: " + text.strip()[:300]
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        return f"the CUDA context is unusable: {exc}"
    return None


_run_cache: list[Any] = []


def _run_module() -> Any:
    """CHECK's kernel_lsp.engine.worker.run, or the module named by $KERNEL_LSP_RUN_MODULE
    (tests put a small stand-in there); None when it does not exist."""
    if not _run_cache:
        name = os.environ.get("KERNEL_LSP_RUN_MODULE") or "kernel_lsp.engine.worker.run"
        try:
            _run_cache.append(importlib.import_module(name))
            getattr(_run_cache[0], "answer_first", lambda: None)()  # this loop calls after_answer
        except ImportError as exc:
            if exc.name != name:
                raise
            _run_cache.append(None)
    return _run_cache[0]


def _after_answer() -> None:
    """What the run module leaves until its answer is out (the GPU memory's release)."""
    run = _run_cache[0] if _run_cache else None
    hook = getattr(run, "after_answer", None)
    if hook is None:
        return
    try:
        hook()
    except Exception as exc:  # noqa: BLE001 - the next request reports a broken context
        print(f"kernel-lsp worker: after the answer: {exc!r}", file=sys.stderr)


def _fallback_device_info() -> dict[str, Any]:
    info: dict[str, Any] = {"host": platform.node(), "python": sys.version.split()[0], "cuda": False}
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return info
    info["torch"] = torch.__version__
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(cuda=True, name=p.name, capability=list(torch.cuda.get_device_capability()),
                    sm_count=p.multi_processor_count, memory_bytes=p.total_memory)
    return info


def _die_with_parent() -> None:
    """Linux: SIGKILL this Worker when the process that started it dies, even while a
    kernel hangs and nobody reads the EOF on its input."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        return
    # The parent died before prctl: nobody is left to answer. (In a sandbox the parent is
    # the pid namespace's init, pid 1, which bwrap's --die-with-parent ends with the client.)
    if os.getppid() == 1 and sandbox.inside() is None:
        os._exit(0)


def main() -> int:
    _die_with_parent()
    sandbox.apply_limits()  # before any import a candidate could have planted, before any request
    proto_in, proto_out = _take_channel()
    faulthandler.enable(file=sys.stderr)  # a segfault leaves a Python stack in the crash report
    early.start()  # the GPU Worker: CUDA's driver and context in a thread, while we import
    # The timer must be captured before any candidate can patch it (timer patching, docs/cheats.md).
    # $KERNEL_LSP_WORKER_PRELOAD (comma-separated) replaces the list; tests with a
    # stand-in run module set it empty to skip importing torch.
    preloaded: list[str] = []
    preload = os.environ.get("KERNEL_LSP_WORKER_PRELOAD", "kernel_lsp.engine.worker.timing.bench")
    for name in filter(None, (n.strip() for n in preload.split(","))):
        try:
            importlib.import_module(name)
            preloaded.append(name)
        except ImportError as exc:
            if exc.name != name:
                print(f"kernel-lsp worker: importing {name} failed: {exc!r}", file=sys.stderr)
    build.install_hooks()
    if early.wanted() and "KERNEL_LSP_WORKER_PRELOAD" not in os.environ:
        # The evaluation modules (dynamo, the profiler) now, while CUDA initializes, rather
        # than at the first request. A failure is left for that request to report.
        try:
            if _run_module() is not None:
                preloaded.append("run")
        except Exception as exc:  # noqa: BLE001
            _run_cache.clear()
            print(f"kernel-lsp worker: importing the run module failed: {exc!r}", file=sys.stderr)
    worker = Worker()
    worker.preloaded = preloaded
    extra = os.environ.get("KERNEL_LSP_WORKER_TEST_OPS")
    if extra:  # tests only: ops that crash, sleep or echo on request (tests/engine/worker_ops.py)
        importlib.import_module(extra).register(worker)
    proto_out.write(protocol.encode({"id": None, "ready": {"pid": os.getpid(), "python": sys.executable}}))
    proto_out.flush()
    while not worker.stop:
        line = proto_in.readline()
        if not line:
            break  # the client went away
        if not line.strip():
            continue
        try:
            message = protocol.decode(line)
        except ValueError as exc:
            response: dict[str, Any] = {"id": None, "error": protocol.error_payload(exc)}
        else:
            if protocol.is_resume(message) or protocol.is_release(message):
                continue  # a line for a turn point nobody waits at (a made-up one): no answer
            notify.install(_partial_sender(proto_out, message), _turn_reader(proto_in, message))
            try:
                response = worker.handle(message)
            finally:
                notify.install(None)
        try:
            data = protocol.encode(response)
        except (TypeError, ValueError) as exc:  # a result that is not JSON
            data = protocol.encode({"id": response.get("id"), "error": protocol.error_payload(exc)})
        proto_out.write(data)
        proto_out.flush()
        _after_answer()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    # Skip interpreter teardown: a candidate's threads or a poisoned CUDA context can hang it.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

"""The Executor on a Ray cluster (optional extra ``kernel-lsp[ray]``; ``ray`` is imported lazily).

- One long-lived actor per GPU (``num_gpus=1``, the GPU kind as ``accelerator_type``) holds a
  warm local ``Engine``: its Worker subprocess gets the same allow-listed environment (and the
  same sandbox) as a Worker on this machine, so a candidate on the cluster runs exactly as it
  would locally, hung kernels are killed at their deadline by that Engine, and a Worker crash
  costs one Worker, not the actor.
- Evaluations go to a free actor; a Search gets ``concurrency`` = the number of actors.
- Builds run as CPU tasks anywhere in the cluster, each in a fresh build Worker with its own
  cache folder; the built files travel back through Ray's object store, keyed by the content
  hash the build cache already uses (cluster_build.py), and the GPU actor unpacks them into its node's cache
  before its Worker loads the candidate (a cache hit: the GPU never waits for nvcc).
- What crosses to the cluster is the Task, the Candidate and options, and the kernel_lsp package
  itself (``py_modules``). Never this process's environment: the actors' ``env_vars`` hold only
  allow-listed, non-secret names given explicitly (``env=``), and the Worker filters again.
- Faults: an actor that dies (its node lost, its process killed) is replaced; its request is
  retried once on another actor, then reported as ``crashed`` naming the nodes. An actor that
  does not answer past the deadline plus a margin is killed and replaced (``timeout``).
  An unreachable address or a cluster without the asked GPU raises ``ExecutorUnavailable``
  within ``connect_timeout``; a cluster lost later turns evaluations into ``not_run`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from kernel_lsp.engine.caller.client import (
    ENV_ALLOW_EXACT,
    ENV_ALLOW_PREFIX,
    Progress,
    _report,
    looks_secret,
    needs_build,
    record,
)
from kernel_lsp.engine.caller.cluster_build import build_in_cluster, unpack_artefact, warm_builder
from kernel_lsp.engine.caller.executor_api import ExecutorUnavailable, StatusCallback
from kernel_lsp.model import Candidate, CompileResult, Evaluation, Task, source_hash
from kernel_lsp.toolchain.nvcc import capability_arch

log = logging.getLogger(__name__)

ACTOR_MARGIN = 60.0        # seconds past an evaluation's deadline before an actor counts as hung
WARM_TIMEOUT = 300.0       # a new actor's Worker start and warm-up
WARM_BUILDERS = 8          # build worker processes started at connect (at most the cluster's CPUs)
HEALTH_PERIOD = 5.0        # seconds between cluster checks
HEALTH_TIMEOUT = 15.0      # a check that takes longer: the cluster is lost
ACTOR_ERRORS = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
                "NodeDiedError", "LocalRayletDiedError", "OwnerDiedError", "ObjectLostError",
                "ActorUnschedulableError")

_connections = {"count": 0, "ours": False}   # one ray.init per process, shared by executors


def _import_ray() -> Any:
    # Ray starts a cluster of its own on this machine when an API is called while not connected
    # (a Ray Client connection that gave up on a lost head, then the watchdog's ray.nodes()):
    # never here, the cluster is the one asked for or none.
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    try:
        import ray  # noqa: PLC0415
    except ImportError:
        raise ExecutorUnavailable("the Ray executor needs Ray: pip install 'kernel-lsp[ray]'") from None
    with contextlib.suppress(Exception):  # ray imported earlier, before the variable was set
        from ray._private import auto_init_hook  # noqa: PLC0415

        auto_init_hook.enable_auto_connect = False
    return ray


def allowed_env(env: dict[str, str] | None) -> dict[str, str]:
    """The names a local Worker would get (client.ENV_ALLOW_*), minus anything secret."""
    return {k: v for k, v in (env or {}).items()
            if (k in ENV_ALLOW_EXACT or k.startswith(ENV_ALLOW_PREFIX)) and not looks_secret(k)}


# Ray Client's answer when the head's client server could not start this connection's own server
# process (a head just started, a loaded machine): transient, so tried again while the connect
# timeout lasts. Any other error is the answer at once.
TRANSIENT_INIT = "Initialization failure from server"


def init_until(init: Callable[[], Any], deadline: float, undo: Callable[[], Any] = lambda: None,
               pause: float = 2.0) -> Any:
    """``init()``, again after ``pause`` (``undo()`` first) while it fails with TRANSIENT_INIT and
    ``deadline`` (time.monotonic) is not reached."""
    while True:
        try:
            return init()
        except Exception as exc:
            if TRANSIENT_INIT not in str(exc) or time.monotonic() + pause >= deadline:
                raise
            log.info("the Ray client server could not start this connection (%s): trying again", exc)
            with contextlib.suppress(Exception):
                undo()
            time.sleep(pause)


async def _blocking(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """Run a blocking Ray call in a daemon thread: a hung call never holds the event loop
    nor, at exit, the interpreter (the default executor's threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not fut.done():
            fut.set_exception(error) if error is not None else fut.set_result(value)

    def run() -> None:
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, value, None)

    threading.Thread(target=run, daemon=True, name=f"kernel-lsp-ray-{what}").start()
    return await asyncio.wait_for(fut, timeout)


def _error_kind(exc: BaseException) -> str:
    return type(exc).__name__


def _is_actor_death(exc: BaseException) -> bool:
    return any(k.__name__ in ACTOR_ERRORS for k in type(exc).__mro__)


# -- the actor ------------------------------------------------------------------------------------


class GpuActor:
    """Lives on a GPU node (Ray gives it one GPU through CUDA_VISIBLE_DEVICES) and keeps one warm
    local Engine there. Async: profile and shutdown calls are not stuck behind a long evaluate."""

    def __init__(self, timeout: float, options: dict[str, Any]) -> None:
        from kernel_lsp.engine.caller.client import Engine  # noqa: PLC0415

        # The node's own interpreter (its KERNEL_LSP_PYTHON or this one), never the caller's path.
        self.engine = Engine(timeout=timeout, options=options, prebuild=False)

    def placed(self) -> int:
        return os.getpid()

    async def ready(self) -> dict[str, Any]:
        import ray  # noqa: PLC0415

        ctx = ray.get_runtime_context()
        info = await self.engine.device_info()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "host": socket.gethostname(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "pid": os.getpid(), "device": info}

    async def evaluate(self, task: dict[str, Any], candidate: dict[str, Any], checks: list[str],
                       timeout: float, options: dict[str, Any], artefact: bytes | None = None) -> dict[str, Any]:
        if artefact:
            try:
                await asyncio.to_thread(unpack_artefact, artefact)
            except Exception:  # noqa: BLE001 - the Worker then builds it itself
                logging.getLogger(__name__).warning("could not unpack a build artefact", exc_info=True)
        ev = await self.engine.evaluate(Task.from_dict(task), Candidate.from_dict(candidate), checks,
                                        timeout=timeout, options=options)
        return ev.to_dict()

    async def profile(self, task: dict[str, Any], candidate: dict[str, Any] | None, timeout: float | None,
                      options: dict[str, Any]) -> dict[str, Any]:
        cand = Candidate.from_dict(candidate) if candidate else None
        return await self.engine.profile(Task.from_dict(task), cand, timeout=timeout, options=options)

    async def shutdown(self) -> None:
        await self.engine.aclose()


@dataclass
class _Slot:
    handle: Any
    info: dict[str, Any] = field(default_factory=dict)
    busy: bool = False
    alive: bool = True

    @property
    def node(self) -> str:
        ip = self.info.get("node_ip") or "?"
        nid = str(self.info.get("node_id") or "")[:12]
        gpus = ",".join(self.info.get("gpu_ids") or [])
        return f"{ip} (node {nid}{', GPU ' + gpus if gpus else ''})"

    @property
    def pid(self) -> int | None:
        return self.info.get("pid")


class RayExecutor:
    """Candidates on GPU actors of a Ray cluster (docs/ray.md)."""

    kind = "ray"

    def __init__(
        self,
        address: str | None,
        *,
        store: Any = None,
        gpu: str | None = None,
        max_gpus: int | None = None,
        timeout: float = 120.0,
        python: str | None = None,
        env: dict[str, str] | None = None,
        options: dict[str, Any] | None = None,
        on_status: StatusCallback | None = None,
        connect_timeout: float = 30.0,
        place_timeout: float = 60.0,
        ship_code: bool = True,
    ) -> None:
        self.address = address or "auto"
        self.store = store
        self.gpu = gpu or None
        self.max_gpus = max_gpus or None
        self.timeout = timeout
        self.python = python  # kept for the interface: the cluster uses its nodes' interpreters
        self.extra_env = dict(env or {})
        self.options = dict(options or {})
        self.on_status = on_status
        self.connect_timeout = connect_timeout
        self.place_timeout = place_timeout
        self.ship_code = ship_code
        self.state = "new"
        self.message = ""
        self.replaced = 0                  # actors that died and were replaced
        self.retried = 0                   # requests retried on another actor
        self.warm_builders: list[int] = []  # pids of the build worker processes started at connect
        self._ray: Any = None
        self._target = 0
        self._slots: list[_Slot] = []
        self._spawning = 0
        self._changed: asyncio.Condition | None = None
        self._builds: dict[str, asyncio.Future[tuple[CompileResult, Any]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watch: asyncio.Task[None] | None = None
        self._device: dict[str, Any] | None = None
        self._actor_cls: Any = None
        self._build_fn: Any = None

    # -- status ----------------------------------------------------------------------------

    @property
    def concurrency(self) -> int:
        return max(1, self._target)

    def status(self) -> dict[str, Any]:
        return {"executor": "ray", "state": self.state, "address": self.address, "gpus": len(self._live()),
                "nodes": sorted({s.node for s in self._live()}), "message": self.message,
                "replaced": self.replaced}

    def _set_state(self, state: str, message: str = "") -> None:
        changed = state != self.state or message != self.message
        self.state, self.message = state, message
        if changed and self.on_status is not None:
            try:
                out = self.on_status(self.status())
                if asyncio.iscoroutine(out):
                    self._spawn_task(out)
            except Exception:  # noqa: BLE001 - a broken display must not stop the executor
                log.debug("status callback failed", exc_info=True)

    def _spawn_task(self, coro: Any) -> asyncio.Task[Any]:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # -- connecting --------------------------------------------------------------------------

    def _runtime_env(self) -> dict[str, Any]:
        renv: dict[str, Any] = {"env_vars": allowed_env(self.extra_env)}
        if self.ship_code:
            import kernel_lsp  # noqa: PLC0415

            renv["py_modules"] = [str(Path(kernel_lsp.__file__).resolve().parent)]
            renv["excludes"] = ["__pycache__", "*.pyc"]
        return renv

    def _probe(self) -> None:
        """A TCP connect to an explicit host:port first: an unreachable address is one clear
        sentence within seconds, not a long retry loop inside ray.init."""
        addr = self.address
        if addr in ("auto", "local"):
            return
        hostport = addr.split("://", 1)[1] if "://" in addr else addr
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ExecutorUnavailable(f"ray_address {addr!r} is not host:port, ray://host:port or auto")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=min(10.0, self.connect_timeout)):
                pass
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise ExecutorUnavailable(f"cannot reach the Ray cluster at {addr}: {reason}") from None

    async def connect(self) -> None:
        ray = self._ray = _import_ray()
        self._changed = asyncio.Condition()
        self.state = "connecting"
        await asyncio.to_thread(self._probe)
        if not ray.is_initialized():
            def init() -> None:
                # The job's runtime_env: this kernel_lsp (py_modules may be uploaded only at the
                # job level) and the allow-listed env_vars; tasks and actors inherit it.
                ray.init(address=self.address, namespace="kernel-lsp", log_to_driver=False,
                         logging_level=logging.WARNING, configure_logging=False,
                         runtime_env=self._runtime_env())
            deadline = time.monotonic() + self.connect_timeout
            try:
                await _blocking(lambda: init_until(init, deadline, ray.shutdown), self.connect_timeout, "init")
            except asyncio.TimeoutError:
                raise ExecutorUnavailable(f"the Ray cluster at {self.address} did not answer within "
                                          f"{self.connect_timeout:.0f} s") from None
            except Exception as exc:  # noqa: BLE001 - ConnectionError, AuthenticationError, ...
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ExecutorUnavailable(f"cannot connect to the Ray cluster at {self.address}: {first}") from None
            _connections["ours"] = True
        _connections["count"] += 1
        capacity, kinds = await self._capacity()
        if capacity == 0:
            await self._release_connection()
            want = f"GPU of kind {self.gpu}" if self.gpu else "GPU"
            have = f" (GPU kinds there: {', '.join(sorted(kinds))})" if kinds else " (it has no GPU)"
            raise ExecutorUnavailable(f"the Ray cluster at {self.address} has no {want}{have}")
        self._target = min(capacity, self.max_gpus) if self.max_gpus else capacity
        self._actor_cls = ray.remote(GpuActor)
        self._build_fn = ray.remote(build_in_cluster)
        await asyncio.gather(*(self._start_spawn() for _ in range(self._target)))
        if not self._live():
            why = self.message
            await self.aclose()
            raise ExecutorUnavailable(f"no GPU actor started on the Ray cluster at {self.address}: {why}")
        self._set_state("connected", f"{len(self._live())} GPU actor(s) on {len({s.info.get('node_id') for s in self._live()})} node(s)")
        self._watch = asyncio.ensure_future(self._watchdog())
        self._spawn_task(self._warm_builders())

    async def _warm_builders(self) -> None:
        """Start the cluster's build worker processes now, not at the first builds: Ray starts a
        worker process (the job's runtime env, kernel_lsp imported) for each build task that finds
        none idle, which cost the first ten builds of a session 4.7 s on the H200. Advisory."""
        try:
            nodes = await _blocking(self._ray.nodes, HEALTH_TIMEOUT, "nodes")
            cpus = sum(int((n.get("Resources") or {}).get("CPU", 0)) for n in nodes if n.get("Alive"))
            count = min(cpus, WARM_BUILDERS)
            if not count:
                return
            warm = self._ray.remote(warm_builder).options(num_cpus=1)
            refs = [warm.remote() for _ in range(count)]
            pids = await asyncio.wait_for(asyncio.gather(*(asyncio.wrap_future(r.future()) for r in refs)), WARM_TIMEOUT)
            self.warm_builders = list(pids)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the first builds then start their workers themselves
            log.debug("warming the build workers failed", exc_info=True)

    async def _capacity(self) -> tuple[int, set[str]]:
        return self._count(await _blocking(self._ray.nodes, HEALTH_TIMEOUT, "nodes"))

    def _count(self, nodes: list[dict[str, Any]]) -> tuple[int, set[str]]:
        """GPUs of the asked kind on live nodes, and the GPU kinds seen."""
        total = 0
        kinds: set[str] = set()
        for n in nodes:
            if not n.get("Alive"):
                continue
            res = n.get("Resources") or {}
            node_kinds = {k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")}
            kinds |= node_kinds
            if self.gpu and self.gpu not in node_kinds:
                continue
            total += int(res.get("GPU", 0))
        return total, kinds

    def _live(self) -> list[_Slot]:
        return [s for s in self._slots if s.alive]

    async def _spawn(self) -> None:
        """Start one GPU actor and wait until its Worker is warm; on failure it is dropped."""
        opts: dict[str, Any] = {"num_cpus": 0, "num_gpus": 1, "max_restarts": 0, "max_task_retries": 0}
        if self.gpu:
            opts["accelerator_type"] = self.gpu
        handle = None
        try:
            handle = self._actor_cls.options(**opts).remote(self.timeout, self.options)
            # Placement first (a cluster without a free GPU of the kind never places it), then
            # the warm-up: the Worker starts and imports torch once, here and not on a deadline.
            await asyncio.wait_for(asyncio.wrap_future(handle.placed.remote().future()), self.place_timeout)
            info = await asyncio.wait_for(asyncio.wrap_future(handle.ready.remote().future()), WARM_TIMEOUT)
            slot = _Slot(handle, info)
            self._slots.append(slot)
            if self._device is None and isinstance(info.get("device"), dict):
                self._device = dict(info["device"])
        except asyncio.TimeoutError:
            self.message = "a GPU actor could not be placed (the cluster has no free GPU of the asked kind)"
            self._kill(handle)
            # The cluster shrank (a node left): aim for what it has now; the watchdog grows it back.
            with contextlib.suppress(Exception):
                capacity, _ = await self._capacity()
                self._target = min(capacity, self.max_gpus) if self.max_gpus else capacity
        except Exception as exc:  # noqa: BLE001
            self.message = f"a GPU actor failed to start: {_first_line(exc)}"
            log.warning("GPU actor failed to start: %s", exc)
            self._kill(handle)
        finally:
            self._spawning -= 1
            await self._notify()

    def _start_spawn(self) -> asyncio.Task[Any]:
        self._spawning += 1  # counted now, so no one starts a second replacement meanwhile
        return self._spawn_task(self._spawn())

    def _kill(self, handle: Any) -> None:
        if handle is None or self._ray is None:
            return
        ray = self._ray

        def kill() -> None:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)

        # In a thread: on a Ray Client connection that is reconnecting (a lost head), ray.kill
        # blocks for the whole grace period, and the event loop (the language server's) must not.
        threading.Thread(target=kill, daemon=True, name="kernel-lsp-ray-kill").start()

    async def _notify(self) -> None:
        if self._changed is None:
            return
        async with self._changed:
            self._changed.notify_all()

    # -- routing -----------------------------------------------------------------------------

    async def _acquire(self) -> _Slot | None:
        """A free live actor, or None when none can come: the cluster is lost or closed, or no
        actor is alive and none is starting. (A dead actor is dropped at once, so a retry always
        lands on another actor.)"""
        assert self._changed is not None
        deadline = time.monotonic() + self.place_timeout + WARM_TIMEOUT
        while True:
            if self.state != "connected":
                return None
            live = self._live()
            if len(live) + self._spawning < self._target:
                self._start_spawn()
            free = [s for s in live if not s.busy]
            if free:
                free[0].busy = True
                return free[0]
            if not live and not self._spawning:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            async with self._changed:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(left, HEALTH_PERIOD))

    async def _release(self, slot: _Slot) -> None:
        slot.busy = False
        await self._notify()

    async def _lose(self, slot: _Slot, why: str) -> None:
        """An actor died or hung: drop it, kill what is left of it, start a replacement."""
        if slot.alive:
            slot.alive = False
            self.replaced += 1
            log.warning("GPU actor on %s lost: %s", slot.node, why)
            self._kill(slot.handle)
            self._slots = [s for s in self._slots if s is not slot]
            if self.state == "connected":
                self._start_spawn()
        await self._notify()

    async def _call(self, slot: _Slot, ref: Any, timeout: float) -> Any:
        try:
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                self._ray.cancel(ref)
            raise

    # -- the Executor interface --------------------------------------------------------------

    async def evaluate(
        self,
        task: Task,
        candidate: Candidate,
        checks: Iterable[str] = ("compile", "verify", "bench"),
        progress: Progress | None = None,
        timeout: float | None = None,
        options: dict[str, Any] | None = None,
        early: Any = None,
    ) -> Evaluation:
        # `early` is taken and never called: an actor's answer comes back whole (a Ray call
        # returns once), so on a cluster the complete Evaluation is the first thing shown.
        del early
        t0 = time.monotonic()
        deadline = self.timeout if timeout is None else timeout
        opts = {**self.options, **(options or {})}
        checks = list(checks)

        def failed(verdict: str, message: str, node: str | None = None) -> Evaluation:
            return Evaluation(task=task.name, candidate=candidate.id, verdict=verdict, correct=None,
                              message=message, device=dict(self._device) if self._device else None,
                              executor="ray", node=node)

        artefact = None
        if needs_build(candidate) and self.state == "connected":
            await _report(progress, "compiling")
            try:
                _, artefact = await self._build(task, candidate, opts)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - advisory: the actor's Worker builds it anyway
                log.debug("cluster build failed", exc_info=True)
        await _report(progress, "evaluating")
        nodes: list[str] = []
        deaths: list[str] = []
        ev: Evaluation | None = None
        for _attempt in range(2):
            slot = await self._acquire()
            if slot is None:
                why = self.message or "no GPU actor is available"
                ev = failed("not_run", f"the Ray cluster at {self.address} is {self.state}: {why}"
                            if self.state != "connected" else f"no GPU actor available on the Ray cluster "
                            f"at {self.address}: {why}", nodes[-1] if nodes else None)
                break
            nodes.append(slot.node)
            ref = slot.handle.evaluate.remote(task.to_dict(), candidate.to_dict(), checks, deadline, opts, artefact)
            try:
                data = await self._call(slot, ref, deadline + ACTOR_MARGIN)
            except asyncio.CancelledError:
                await self._release(slot)
                raise
            except asyncio.TimeoutError:
                await self._lose(slot, "did not answer past its deadline")
                ev = failed("timeout", f"the GPU actor on {slot.node} did not answer within "
                            f"{deadline + ACTOR_MARGIN:g} s; it was replaced", slot.node)
                break
            except Exception as exc:  # noqa: BLE001
                if _is_actor_death(exc):
                    deaths.append(f"{slot.node}: {_first_line(exc)}")
                    await self._lose(slot, _first_line(exc))
                    self.retried += 1
                    continue
                await self._release(slot)
                ev = failed("error", f"the Ray cluster could not run the evaluation on {slot.node}: "
                            f"{_error_kind(exc)}: {_first_line(exc)}", slot.node)
                break
            await self._release(slot)
            ev = Evaluation.from_dict(data)
            ev.node = slot.node
            break
        if ev is None:
            ev = failed("crashed", "the GPU actor died while evaluating this candidate, twice (it was replaced "
                        "each time): " + "; ".join(deaths), nodes[-1] if nodes else None)
        ev.executor = "ray"
        ev.wall_seconds = time.monotonic() - t0
        await self._record(task, candidate, ev, progress)
        await _report(progress, "done")
        return ev

    async def _record(self, task: Task, candidate: Candidate, ev: Evaluation, progress: Progress | None) -> None:
        await record(self.store, task, candidate, ev, progress)

    def _arch(self, opts: dict[str, Any]) -> str | None:
        if opts.get("arch"):
            return str(opts["arch"])
        return capability_arch((self._device or {}).get("capability"))  # the actors' own target

    async def _build(self, task: Task, candidate: Candidate, opts: dict[str, Any]) -> tuple[CompileResult, Any]:
        """(CompileResult, a reference to the built files in the object store); one build per
        content hash, however many callers ask for it."""
        build_opts = dict(opts)
        arch = self._arch(opts)
        if arch:
            build_opts["arch"] = arch  # the cache key: build for the GPU the actors load on
        ref_path = task.reference_path or f"{task.name}.py"
        filename = (task.cuda_path or ref_path.replace(".py", ".cu")) if candidate.kind == "cuda" \
            else ref_path.replace(".py", "_candidate.py")
        key = source_hash(candidate.source, candidate.kind, filename, json.dumps(build_opts, sort_keys=True, default=str))
        fut = self._builds.get(key)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):
            fut = asyncio.ensure_future(self._run_build(candidate.kind, candidate.source, filename, build_opts))
            self._builds[key] = fut
        return await asyncio.shield(fut)

    async def _run_build(self, kind: str, source: str, filename: str, opts: dict[str, Any]) -> tuple[CompileResult, Any]:
        result_ref, files_ref = self._build_fn.options(
            num_cpus=1, num_returns=2, max_retries=1,
        ).remote(kind, source, filename, opts)
        data = await asyncio.wait_for(asyncio.wrap_future(result_ref.future()), 900.0)
        result = CompileResult.from_dict(data)
        return result, (files_ref if result.ok else None)

    async def prebuild(self, task: Task, candidate: Candidate, options: dict[str, Any] | None = None,
                       timeout: float | None = None) -> CompileResult:
        if not needs_build(candidate):
            # Nothing to compile: a cluster task would only start a Worker to import the module,
            # which the evaluation does anyway.
            return CompileResult(ok=True, log="nothing to build before the evaluation")
        opts = {**self.options, **(options or {})}
        coro = self._build(task, candidate, opts)
        result, _ = await (asyncio.wait_for(coro, timeout) if timeout else coro)
        return result

    async def profile(self, task: Task, candidate: Candidate | None = None, timeout: float | None = None,
                      options: dict[str, Any] | None = None) -> dict[str, Any]:
        opts = {**self.options, **(options or {})}
        deadline = self.timeout if timeout is None else timeout
        slot = await self._acquire()
        if slot is None:
            return {"verdict": "not_run", "error": f"the Ray cluster at {self.address} is {self.state}: {self.message}"}
        ref = slot.handle.profile.remote(task.to_dict(), candidate.to_dict() if candidate else None, deadline, opts)
        try:
            result = await self._call(slot, ref, deadline + ACTOR_MARGIN)
        except asyncio.CancelledError:
            await self._release(slot)
            raise
        except asyncio.TimeoutError:
            await self._lose(slot, "did not answer past its deadline")
            return {"verdict": "timeout", "error": f"the GPU actor on {slot.node} did not answer; it was replaced"}
        except Exception as exc:  # noqa: BLE001
            if _is_actor_death(exc):
                await self._lose(slot, _first_line(exc))
                return {"verdict": "crashed", "error": f"the GPU actor on {slot.node} died: {_first_line(exc)}"}
            await self._release(slot)
            return {"verdict": "error", "error": f"{_error_kind(exc)}: {_first_line(exc)}"}
        await self._release(slot)
        if isinstance(result, dict):
            result.setdefault("node", slot.node)
        return result

    async def device_info(self, timeout: float | None = None) -> dict[str, Any]:
        info = dict(self._device or {})
        info.update({"executor": "ray", "gpus": len(self._live()), "nodes": self.status()["nodes"]})
        return info

    # -- health and shutdown -------------------------------------------------------------------

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_PERIOD)
            try:
                nodes = await _blocking(self._ray.nodes, HEALTH_TIMEOUT, "health")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - timeout or a dead connection
                self._set_state("lost", f"the Ray cluster at {self.address} stopped answering: {_first_line(exc) or 'no answer'}")
                await self._notify()
                continue
            alive = {n.get("NodeID") for n in nodes if n.get("Alive")}
            for slot in list(self._live()):
                if slot.info.get("node_id") not in alive and not slot.busy:
                    await self._lose(slot, "its node left the cluster")
            capacity, _ = self._count(nodes)
            self._target = min(capacity, self.max_gpus) if self.max_gpus else capacity
            while len(self._live()) + self._spawning < self._target:
                self._start_spawn()
            live = self._live()
            msg = f"{len(live)} GPU actor(s) on {len({s.info.get('node_id') for s in live})} node(s)"
            self._set_state("connected", msg)

    async def _release_connection(self) -> None:
        _connections["count"] = max(0, _connections["count"] - 1)
        if _connections["count"] == 0 and _connections["ours"] and self._ray is not None:
            _connections["ours"] = False
            with contextlib.suppress(Exception):
                await _blocking(self._ray.shutdown, 20.0, "shutdown")

    async def aclose(self) -> None:
        if self.state == "closed":
            return
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(BaseException):
                await self._watch
        for t in list(self._tasks):
            t.cancel()
        slots, self._slots = self._slots, []
        lost = self.state == "lost"
        self._set_state("closed", "closed")
        await self._notify()
        if self._ray is not None:
            refs = []
            # A lost cluster gets no calls (each would block on the dead connection): its actors
            # end with this driver's job when the connection goes.
            for s in [] if lost else slots:
                with contextlib.suppress(Exception):
                    refs.append(asyncio.wrap_future(s.handle.shutdown.remote().future()))
            if refs:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.gather(*refs, return_exceptions=True), 10.0)
            for s in [] if lost else slots:
                self._kill(s.handle)
            await self._release_connection()
            self._ray = None
        self._builds.clear()

    async def __aenter__(self) -> "RayExecutor":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return type(exc).__name__

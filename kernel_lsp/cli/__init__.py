"""kernel-lsp serve | check | bench | profile | optimize | report.

Each subcommand imports what it needs when it runs, so `serve` starts without torch or
openai, and `check` without pygls.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from kernel_lsp import __version__
from kernel_lsp.cli.exits import CANCELLED, CANNOT_RUN, HELP as EXIT_HELP, CannotRun
from kernel_lsp.config import SEEDS


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if not getattr(ns, "command", None):
        parser.print_help(sys.stderr)
        return CANNOT_RUN
    debug = bool(getattr(ns, "debug", False) or os.environ.get("KERNEL_LSP_DEBUG"))
    try:
        return int(ns.run(ns) or 0)
    except KeyboardInterrupt:
        print(f"kernel-lsp {ns.command}: cancelled", file=sys.stderr)
        return CANCELLED
    except CannotRun as exc:
        print(f"kernel-lsp {ns.command}: {exc}", file=sys.stderr)
        return CANNOT_RUN
    except Exception as exc:  # never a traceback for the user: one line, and how to see more
        if _could_not_run(exc):  # sandbox = "required" with none here, an unreachable cluster
            print(f"kernel-lsp {ns.command}: {exc}", file=sys.stderr)
            return CANNOT_RUN
        if debug:
            raise
        print(f"kernel-lsp {ns.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        print("  (rerun with --debug or KERNEL_LSP_DEBUG=1 for the traceback)", file=sys.stderr)
        return CANNOT_RUN


def _could_not_run(exc: Exception) -> bool:
    from kernel_lsp.engine.caller.executor_api import ExecutorUnavailable
    from kernel_lsp.engine.caller.sandbox import SandboxUnavailable

    return isinstance(exc, (SandboxUnavailable, ExecutorUnavailable))


def _sub(sub, name: str, help: str, codes: str) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with what its exit statuses mean."""
    import textwrap

    mine = textwrap.fill(f"kernel-lsp {name}: {codes}", width=88, subsequent_indent="  ")
    return sub.add_parser(name, help=help, description=help, epilog=f"{EXIT_HELP}\n\n{mine}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernel-lsp", description=__doc__.splitlines()[0], epilog=EXIT_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kernel-lsp {__version__}")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks (also KERNEL_LSP_DEBUG=1)")
    sub = parser.add_subparsers(dest="command")

    serve = _sub(sub, "serve", "run the language server (stdio by default)",
                 "0 when the client shut it down, 2 when it could not start")
    serve.add_argument("--stdio", action="store_true", help="talk over stdin/stdout (the default)")
    serve.add_argument("--tcp", metavar="HOST:PORT", help="listen on a TCP port instead of stdio")
    serve.add_argument("--log-file", help="write the server log here (default: stderr)")
    serve.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default), ERROR")
    serve.set_defaults(run=_serve)

    check = _sub(sub, "check", "compile diagnostics and resource usage for files or folders",
                 "0 no errors; 1 a compile error or a wrong result; 2 a file missing, unreadable or with "
                 "no kernel, or a requested correctness check that could not run")
    check.add_argument("paths", nargs="+", metavar="PATH")
    check.add_argument("--json", action="store_true", help="print one JSON document")
    check.add_argument("--arch", help="target architecture, e.g. sm_90")
    check.add_argument("--nvcc", help="the nvcc to use")
    check.add_argument("--verify", choices=("auto", "yes", "no"), default="auto",
                       help="also run the correctness check of Targets with a harness (auto: when a GPU is visible)")
    check.set_defaults(run=_check)

    bench = _sub(sub, "bench", "verify and time a task or .cu against PyTorch eager and torch.compile",
                 "0 every candidate correct (or a reference timed); 1 a wrong or disqualified candidate; "
                 "2 a file that is not a Task or unreadable, or a .cu with no GPU")
    bench.add_argument("paths", nargs="+", metavar="PATH")
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                       help="bound on each candidate run (default 300)")
    bench.add_argument("--compile-mode", choices=("default", "max-autotune"), default="default")
    bench.add_argument("--remeasure-baselines", action="store_true",
                       help="time PyTorch eager and torch.compile again, even when kept ones match "
                            "(they are kept in .kernel-lsp/ per reference, inputs, GPU, torch and compile mode)")
    bench.add_argument("--timings", action="store_true",
                       help="print where the command's seconds went, phase by phase: each as it begins, then a table "
                            "(stderr; `timings` in --json)")
    bench.add_argument("--keep-worker", type=float, default=None, metavar="SECONDS",
                       help="keep the GPU Worker (torch imported, CUDA ready, holding its GPU memory) this long "
                            "after the command, so the next bench on this machine reuses it (default 120, or "
                            "$KERNEL_LSP_KEEP_WORKER; 0: none)")
    _executor_flags(bench)
    bench.set_defaults(run=_engine_command("bench_main"))

    profile = _sub(sub, "profile", "hot ops of a PyTorch task, Nsight Compute metrics of a kernel",
                   "0 profiled; 2 a file that is not a Task or unreadable, or a kernel with no GPU")
    profile.add_argument("paths", nargs="+", metavar="PATH")
    profile.add_argument("--json", action="store_true")
    profile.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS")
    _executor_flags(profile)
    profile.set_defaults(run=_engine_command("profile_main"))

    optimize = _sub(sub, "optimize", "search for a faster, verified version of a Target",
                    "0 a correct, faster version found (and written with --out/--apply); 1 none found; "
                    "2 bad input, no GPU for a .cu, no model configured for --proposer llm, "
                    "or an endpoint that cannot be reached")
    optimize.add_argument("target", metavar="PATH[:TARGET]")
    optimize.add_argument("--proposer", choices=("llm", "tuner"), help="default: llm when a model is configured")
    optimize.add_argument("--model", help="model name at the OpenAI-compatible endpoint")
    optimize.add_argument("--base-url", help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)")
    optimize.add_argument("--budget", type=int, default=24, metavar="N",
                          help="cap on proposals (default 24; each Search also stops at 32 evaluations)")
    optimize.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS")
    optimize.add_argument("--seed", choices=SEEDS, default=None,
                          help="LLM Search of a PyTorch module on a GPU: 'inductor' first verifies and times the "
                               "file torch.compile's kernels make (one torch.compile, ~20 s) and builds on it; "
                               "'none' starts from your code alone (default: the agent.seed setting, 'inductor')")
    optimize.add_argument("--no-baselines", dest="baselines", action="store_false",
                          help="skip timing PyTorch eager and torch.compile (slow for some references on a CPU)")
    optimize.add_argument("--kernels-only", dest="kernels_only", action="store_true", default=None,
                          help="count only custom kernels: refuse PyTorch rewrites (KernelBench scoring); "
                               "also the kernels_only setting")
    where = optimize.add_mutually_exclusive_group()
    where.add_argument("--apply", action="store_true", help="rewrite the target in place if improved")
    where.add_argument("--out", metavar="FILE", help="write the best candidate's file here if improved")
    optimize.add_argument("--json", action="store_true")
    optimize.add_argument("--library-ops", action="store_true",
                          help="--whole-model: also search ops that are one cuBLAS/cuDNN call (nn.Linear, nn.Conv*)")
    optimize.add_argument("--whole-model", action="store_true",
                          help="profile the model, search a kernel per hot op, put the winners back behind guards")
    optimize.add_argument("--min-share", type=float, metavar="F",
                          help="--whole-model: ops below this share of forward are left alone (default 0.05)")
    _executor_flags(optimize)
    optimize.set_defaults(run=_optimize)

    report = _sub(sub, "report", "render a Search as an HTML page",
                  "0 the page was written; 2 no store, no such search, or a bad search id")
    report.add_argument("search", nargs="?", help="search id (default: the latest)")
    report.add_argument("--out", metavar="FILE", help="where to write the page")
    report.add_argument("--root", default=".", help="workspace holding .kernel-lsp/ (default .)")
    report.set_defaults(run=_agent_command("report_main"))
    return parser


def _serve(ns: argparse.Namespace) -> int:
    handler: logging.Handler = (logging.FileHandler(ns.log_file) if ns.log_file
                                else logging.StreamHandler(sys.stderr))  # never stdout: the LSP channel
    logging.basicConfig(level=ns.log_level.upper(), handlers=[handler],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kernel_lsp.server.app import create_server

    server = create_server()
    if ns.tcp:
        host, _, port = ns.tcp.rpartition(":")
        server.start_tcp(host or "127.0.0.1", int(port))
    else:
        server.start_io()
    return 0


def _check(ns: argparse.Namespace) -> int:
    from kernel_lsp.cli.check import check_main

    return check_main(ns)


def _engine_command(name: str):
    def run(ns: argparse.Namespace) -> int:
        from kernel_lsp.cli import bench

        return getattr(bench, name)(ns)

    return run


def _optimize(ns: argparse.Namespace) -> int:
    if ns.whole_model:
        from kernel_lsp.cli.whole_model import whole_model_main

        return whole_model_main(ns)
    from kernel_lsp.cli.optimize import optimize_main

    return optimize_main(ns)


def _agent_command(name: str):
    def run(ns: argparse.Namespace) -> int:
        from kernel_lsp.cli import optimize

        return getattr(optimize, name)(ns)

    return run


def _executor_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", choices=("local", "ray"),
                        help="where candidates run: local subprocesses (default) or a Ray cluster")
    parser.add_argument("--ray-address", metavar="ADDRESS",
                        help="the Ray cluster (ray://host:10001, host:6379 or auto); implies --executor ray")

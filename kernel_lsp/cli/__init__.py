"""kernel-lsp serve | check | bench | profile | optimize | report.

Each subcommand imports what it needs when it runs, so `serve` starts without torch or
openai, and `check` without pygls.
"""

from __future__ import annotations

import argparse
import logging
import sys

from kernel_lsp import __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if not getattr(ns, "command", None):
        parser.print_help(sys.stderr)
        return 2
    from kernel_lsp.engine.sandbox import SandboxUnavailable

    try:
        return int(ns.run(ns) or 0)
    except SandboxUnavailable as exc:  # sandbox = "required" and none can run: could not run
        print(f"kernel-lsp: {exc}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernel-lsp", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kernel-lsp {__version__}")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="run the language server (stdio by default)")
    serve.add_argument("--stdio", action="store_true", help="talk over stdin/stdout (the default)")
    serve.add_argument("--tcp", metavar="HOST:PORT", help="listen on a TCP port instead of stdio")
    serve.add_argument("--log-file", help="write the server log here (default: stderr)")
    serve.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default), ERROR")
    serve.set_defaults(run=_serve)

    check = sub.add_parser("check", help="compile diagnostics and resource usage for files or folders")
    check.add_argument("paths", nargs="+", metavar="PATH")
    check.add_argument("--json", action="store_true", help="print one JSON document")
    check.add_argument("--arch", help="target architecture, e.g. sm_90")
    check.add_argument("--nvcc", help="the nvcc to use")
    check.add_argument("--verify", choices=("auto", "yes", "no"), default="auto",
                       help="also run the correctness check of Targets with a harness (auto: when a GPU is visible)")
    check.set_defaults(run=_check)

    bench = sub.add_parser("bench", help="verify and time a task or .cu against PyTorch eager and torch.compile")
    bench.add_argument("paths", nargs="+", metavar="PATH")
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                       help="bound on each candidate run (default 300)")
    bench.add_argument("--compile-mode", choices=("default", "max-autotune"), default="default")
    _executor_flags(bench)
    bench.set_defaults(run=_engine_command("bench_main"))

    profile = sub.add_parser("profile", help="hot ops of a PyTorch task, Nsight Compute metrics of a kernel")
    profile.add_argument("paths", nargs="+", metavar="PATH")
    profile.add_argument("--json", action="store_true")
    profile.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS")
    _executor_flags(profile)
    profile.set_defaults(run=_engine_command("profile_main"))

    optimize = sub.add_parser("optimize", help="search for a faster, verified version of a Target")
    optimize.add_argument("target", metavar="PATH[:TARGET]")
    optimize.add_argument("--proposer", choices=("llm", "tuner"), help="default: llm when a model is configured")
    optimize.add_argument("--model", help="model name at the OpenAI-compatible endpoint")
    optimize.add_argument("--base-url", help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)")
    optimize.add_argument("--budget", type=int, default=8, metavar="N", help="cap on proposals (default 8)")
    optimize.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS")
    optimize.add_argument("--no-baselines", dest="baselines", action="store_false",
                          help="skip timing PyTorch eager and torch.compile (slow for some references on a CPU)")
    where = optimize.add_mutually_exclusive_group()
    where.add_argument("--apply", action="store_true", help="rewrite the target in place if improved")
    where.add_argument("--out", metavar="FILE", help="write the best candidate's file here if improved")
    optimize.add_argument("--json", action="store_true")
    optimize.add_argument("--whole-model", action="store_true",
                          help="profile the model, search a kernel per hot op, put the winners back behind guards")
    optimize.add_argument("--min-share", type=float, metavar="F",
                          help="--whole-model: ops below this share of forward are left alone (default 0.05)")
    _executor_flags(optimize)
    optimize.set_defaults(run=_optimize)

    report = sub.add_parser("report", help="render a Search as an HTML page")
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

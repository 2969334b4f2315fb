"""`kernel-lsp check`: compile diagnostics and resource usage for files or folders."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path

from kernel_lsp.analysis import compile_document, kernel_resources, resource_warnings
from kernel_lsp.cli.exits import CANNOT_RUN, OK, PROBLEM, could_not_run, gpu_hint
from kernel_lsp.config import Settings, SettingsError, load_settings
from kernel_lsp.model import CompileResult, Diagnostic, ResourceUsage
from kernel_lsp.source import SourceError, parse_document, read_text

SUFFIXES = (".cu", ".cuh", ".py")
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".kernel-lsp", "build", "dist"}

@dataclasses.dataclass
class FileReport:
    path: str
    results: list[CompileResult]
    diagnostics: list[Diagnostic]
    resources: list[ResourceUsage]
    error: str | None = None  # the file could not be read at all
    verification: dict | None = None  # Evaluation.summary() when the correctness check ran
    not_verified: str | None = None  # why a requested correctness check could not run
    skipped: str | None = None  # a file named on the command line with nothing to check

    @property
    def wrong(self) -> bool:
        """The correctness check ran and found the candidate wrong (or it raised, crashed...)."""
        v = self.verification
        return v is not None and v.get("verdict") != "correct" and not could_not_run(v.get("verdict"), v.get("message"))

    @property
    def errors(self) -> int:
        return (1 if self.wrong else 0) + sum(d.severity == "error" for d in self.diagnostics)

    @property
    def warnings(self) -> int:
        return sum(d.severity == "warning" for d in self.diagnostics)

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "ok": self.errors == 0 and not self.skipped and not self.error,
            "error": self.error,
            "diagnostics": [d.to_dict() for d in self.diagnostics],
            "resources": [r.to_dict() for r in self.resources],
            "compile_seconds": round(sum(r.seconds for r in self.results), 3),
            "cached": bool(self.results) and all(r.cached for r in self.results),
            "verification": self.verification,
            "not_verified": self.not_verified,
            "skipped": self.skipped,
        }


def collect_files(paths: list[str]) -> list[Path]:
    """The CUDA and Python files under `paths`; a missing path is an error the caller reports."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for folder, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
                found.extend(Path(folder, f) for f in sorted(files) if f.endswith(SUFFIXES))
        elif path.exists():
            found.append(path)
        else:
            raise FileNotFoundError(f"no such file or folder: {raw}")
    return found


NO_KERNEL = ("no CUDA kernel to check: a .py is checked when it passes CUDA source to "
             "load_inline or load; a .cu or .cuh always is")


async def check_file(path: Path, settings: Settings, limit: asyncio.Semaphore,
                     named: bool = False) -> FileReport | None:
    try:
        text = read_text(str(path))
    except (OSError, SourceError) as exc:
        return FileReport(str(path), [], [], [], error=str(exc))
    doc = parse_document(str(path), text)
    if path.suffix == ".py" and not any(e.kind == "cuda" for e in doc.embedded):
        # Nothing for nvcc: a file found in a folder is skipped; one named is told so.
        return FileReport(str(path), [], [], [], skipped=NO_KERNEL) if named else None
    async with limit:
        results = await compile_document(doc, settings)
    usage = kernel_resources(doc, results, settings.effective_arch)
    diagnostics = [d for r in results for d in r.diagnostics if d.path in (None, doc.path)]
    diagnostics += resource_warnings(doc, usage, settings)
    diagnostics.sort(key=lambda d: (d.span.start_line, d.span.start_col))
    return FileReport(str(path), results, diagnostics, list(usage.values()))


async def check_paths(paths: list[str], settings: Settings) -> list[FileReport]:
    limit = asyncio.Semaphore(max(1, os.cpu_count() or 1))
    files = collect_files(paths)
    named = {Path(p) for p in paths if not Path(p).is_dir()}
    reports = await asyncio.gather(*(check_file(f, settings, limit, f in named) for f in files))
    return [r for r in reports if r is not None]


async def verify_reports(reports: list[FileReport], settings: Settings) -> None:
    """The correctness check (no timing) of every checked file that is a Task with a candidate."""
    from kernel_lsp.engine import Engine, find_task
    from kernel_lsp.engine.caller.tasks import TaskError

    async with Engine(python=settings.python, device=settings.device, timeout=settings.timeout,
                      options={"arch": settings.effective_arch}) as engine:
        for report in reports:
            if report.errors or report.skipped or report.error or not report.path.endswith((".cu", ".py")):
                continue
            try:
                task, candidate = find_task(report.path, read_text(report.path))
            except (TaskError, SourceError, UnicodeDecodeError):
                continue
            if candidate is None:
                continue
            ev = await engine.evaluate(task, candidate, checks=("compile", "verify"))
            report.verification = ev.summary()
            if could_not_run(ev.verdict, ev.message):
                report.not_verified = ev.message or ev.verdict


def wants_verify(ns: argparse.Namespace, settings: Settings) -> bool:
    if ns.verify == "no" or not settings.execution_enabled:
        return False
    if ns.verify == "yes":
        return True
    from kernel_lsp.config import detect_arch

    if detect_arch() is None:
        print("kernel-lsp check: no GPU visible: compile checks only (--verify yes runs the "
              "correctness check on the CPU where the task allows)", file=sys.stderr)
        return False
    return True


async def run_checks(ns: argparse.Namespace, settings: Settings) -> list[FileReport]:
    reports = await check_paths(ns.paths, settings)
    if wants_verify(ns, settings):
        await verify_reports(reports, settings)
    return reports


def check_main(ns: argparse.Namespace) -> int:
    try:
        settings = load_settings(os.getcwd(), {"arch": ns.arch, "nvcc": ns.nvcc})
        reports = asyncio.run(run_checks(ns, settings))
    except (FileNotFoundError, SettingsError) as exc:
        print(f"kernel-lsp check: {exc}", file=sys.stderr)
        return CANNOT_RUN
    errors = sum(r.errors for r in reports)
    unverified = [r for r in reports if r.not_verified]
    hint = gpu_hint(" ".join(r.not_verified or "" for r in unverified), settings.python) if unverified else None
    if ns.json:
        json.dump({"files": [r.to_dict() for r in reports], "errors": errors,
                   "warnings": sum(r.warnings for r in reports),
                   "not_verified": len(unverified), "skipped": sum(1 for r in reports if r.skipped),
                   "unreadable": sum(1 for r in reports if r.error),
                   "hint": hint}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_reports(reports, hint)
    if errors:
        return PROBLEM
    if unverified or any(r.skipped or r.error for r in reports):
        return CANNOT_RUN
    return OK


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def print_reports(reports: list[FileReport], hint: str | None = None) -> None:
    from kernel_lsp.cli.console import console as make_console
    from rich.table import Table

    console = make_console()
    for report in reports:
        if report.error:
            console.print(f"{report.path}: [yellow]cannot check[/]: {report.error}", soft_wrap=True)
        if report.skipped:
            console.print(f"{report.path}: not checked: {report.skipped}", soft_wrap=True)
        for d in report.diagnostics:
            where = f"{report.path}:{d.span.start_line + 1}:{d.span.start_col + 1}"
            style = {"error": "red", "warning": "yellow"}.get(d.severity, "")
            console.print(f"{where}: [{style}]{d.severity}[/]: {d.message}" if style
                          else f"{where}: {d.severity}: {d.message}", soft_wrap=True)
        if report.not_verified:
            console.print(f"{report.path}: [yellow]not verified[/]: {report.not_verified}", soft_wrap=True)
        elif report.verification is not None:
            v = report.verification
            style = "green" if v["verdict"] == "correct" else "red"
            console.print(f"{report.path}: [{style}]{v['verdict']}[/]: {v.get('message') or ''}", soft_wrap=True)
    table = Table(title="Kernel resources (ptxas)")
    for column in ("file", "kernel", "arch", "regs", "shared B", "stack B", "spills st/ld B", "occupancy"):
        table.add_column(column)
    for report in reports:
        for res in report.resources:
            occ = (f"{res.occupancy:.0%} @ {res.threads_per_block}"
                   + (f" ({res.occupancy_limiter})" if res.occupancy_limiter and res.occupancy < 1 else "")
                   if res.occupancy is not None else "-")
            table.add_row(os.path.relpath(report.path), res.kernel, res.arch, str(res.registers),
                          str(res.shared_bytes), str(res.stack_bytes),
                          f"{res.spill_stores}/{res.spill_loads}", occ)
    if table.row_count:
        console.print(table)
    errors = sum(r.errors for r in reports)
    warnings = sum(r.warnings for r in reports)
    checked = sum(1 for r in reports if not r.skipped and not r.error)
    line = f"{_plural(checked, 'file')} checked: {_plural(errors, 'error')}, {_plural(warnings, 'warning')}"
    unverified = sum(1 for r in reports if r.not_verified)
    skipped = sum(1 for r in reports if r.skipped)
    if unverified:
        line += f"; {unverified} not verified (the correctness check could not run)"
    if skipped:
        line += f"; {skipped} not checked (no kernel)"
    unreadable = sum(1 for r in reports if r.error)
    if unreadable:
        line += f"; {unreadable} not readable"
    console.print(line, highlight=False)
    if hint:
        console.print(f"hint: {hint}", soft_wrap=True, highlight=False)

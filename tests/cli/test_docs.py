"""The user-facing docs: no references to a design file users do not have, the cheats and
exit-status pages exist and agree with the code, the README states the rule."""

import re
import subprocess
from pathlib import Path

from kernel_lsp.cli.exits import HELP
from kernel_lsp.cli.numbers import REWRITE_LABEL
from kernel_lsp.model import DISQUALIFYING_FLAGS

ROOT = Path(__file__).resolve().parents[2]
# Files outside this change's area that still cite the design file; their owners fix them
# (engine/, server/). Empty this list when they have.
PENDING: set[str] = set()  # files allowed to cite the internal design notes: none
CITATION = re.compile(r"DESIGN(\.md|:)|\bcheat \d+\b|\.\./shared")


def test_no_design_file_or_numbered_cheat_citations():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        if name in PENDING or name == "tests/cli/test_docs.py" or not name.endswith(
                (".py", ".md", ".lua", ".ts", ".json", ".toml", ".sh", "Makefile")):
            continue
        text = (ROOT / name).read_text(errors="replace")
        found += [f"{name}:{i + 1}: {line.strip()}" for i, line in enumerate(text.splitlines()) if CITATION.search(line)]
    assert not found, "\n".join(found)


def test_cheats_page_names_every_disqualifying_flag():
    page = (ROOT / "docs" / "cheats.md").read_text()
    for flag in DISQUALIFYING_FLAGS:
        assert f"`{flag}`" in page, flag
    assert REWRITE_LABEL in page and "--kernels-only" in page


def test_exit_codes_documented():
    readme = (ROOT / "README.md").read_text()
    page = (ROOT / "docs" / "exit-codes.md").read_text()
    assert "docs/exit-codes.md" in readme and REWRITE_LABEL in readme
    for code in ("**0**", "**1**", "**2**"):
        assert code in readme
    assert "| 2 | it could not run" in page and "KERNEL_LSP_DEBUG=1" in page and "KERNEL_LSP_DEBUG=1" in HELP

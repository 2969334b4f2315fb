"""benchmarks/mutation_check.py: every mutation's text is still in the code (a moved defence fails
here, in the CPU suite, before anyone runs the check), and a patch that does not apply stops it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "benchmarks" / "mutation_check.py")
mc = importlib.util.module_from_spec(spec)
sys.modules["mutation_check"] = mc  # its dataclasses look their module up
spec.loader.exec_module(mc)


@pytest.mark.parametrize("mutation", mc.MUTATIONS, ids=lambda m: m.name)
def test_each_mutation_applies_to_the_code_as_it_is(mutation, tmp_path):
    for rel, old, new in mutation.patches:
        assert (ROOT / rel).read_text().count(old) == 1, f"{rel} no longer holds {old!r}: write the mutation again"
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    mc.apply(tmp_path, mutation)
    for rel, old, new in mutation.patches:
        text = (tmp_path / rel).read_text()
        assert old not in text and new in text
    assert all((ROOT / t).is_file() for t in mutation.tests)


def test_a_patch_whose_text_moved_stops_the_check(tmp_path):
    moved = mc.Mutation("moved", "", (("a.py", "x = 1", "x = 2"),), ())
    (tmp_path / "a.py").write_text("x  =  1\n")
    with pytest.raises(mc.PatchMissing, match="holds 0 copies of 'x = 1'"):
        mc.apply(tmp_path, moved)

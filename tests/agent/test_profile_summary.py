"""The profile the model reads: per kernel name, hottest first, each kernel whole."""

import pytest

pytest.importorskip("torch")

from kernel_lsp.agent.prompts import describe_profile
from kernel_lsp.engine.worker.timing import profile

CSV = "\n".join([
    '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"',
    '"0","small_kernel","gpu__time_duration.sum","nsecond","1000"',
    '"0","small_kernel","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","10"',
    '"1","big_kernel","gpu__time_duration.sum","nsecond","50000"',
    '"1","big_kernel","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","91"',
    '"1","big_kernel","lts__t_sector_hit_rate.pct","%","12.5"',
    '"2","big_kernel","gpu__time_duration.sum","nsecond","30000"',
    '"2","big_kernel","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","88"',
] + [f'"{i}","k{i}","gpu__time_duration.sum","nsecond","{100 + i}"' for i in range(3, 15)])


def test_summary_per_kernel_hottest_first_with_the_extra_metrics():
    out = profile.summarize(profile.parse_ncu_csv(CSV), top=4)
    big = out["kernels"][0]
    assert big["kernel"] == "big_kernel" and big["calls"] == 2 and big["total_ms"] == pytest.approx(0.08)
    assert big["duration_ms"] == pytest.approx(0.04) and big["dram_pct"] == 91.0 and big["l2_hit_pct"] == 12.5
    assert big["limiter"] == "memory" and out["kernels"][1]["kernel"] == "small_kernel"
    assert out["other_kernels"]["names"] == 12 - 2 and out["launches"] == 15


def test_the_prompt_never_cuts_a_kernel_in_the_middle():
    prof = {"tool": "ncu", "command": "ncu ...", **profile.summarize(profile.parse_ncu_csv(CSV), top=20)}
    text = describe_profile(prof, limit=600)
    assert text.splitlines()[1].startswith('{"kernel": "big_kernel"') and "ncu ..." not in text
    assert "cooler kernel(s) left out of" in text
    for line in text.splitlines()[1:-1]:
        assert line.startswith("{") and line.endswith("}")  # every kernel shown is whole

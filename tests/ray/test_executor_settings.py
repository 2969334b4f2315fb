"""Settings and flags that pick the Executor (no cluster needed)."""

import argparse

import pytest

from kernel_lsp.cli import build_parser
from kernel_lsp.config import Settings, SettingsError
from kernel_lsp.engine.caller.executor import executor_settings
from kernel_lsp.model import Evaluation


def test_settings_accept_the_ray_keys_in_editor_and_pyproject_spellings():
    s = Settings().merged({"executor": "ray", "rayAddress": "ray://gpu-box:10001", "gpu": "H100", "maxGpus": 4})
    assert (s.executor, s.ray_address, s.gpu, s.max_gpus) == ("ray", "ray://gpu-box:10001", "H100", 4)
    assert Settings().merged({"ray_address": "auto"}).ray_address == "auto"
    assert Settings().executor == "local" and Settings().max_gpus == 0
    with pytest.raises(SettingsError, match="executor"):
        Settings().merged({"executor": "slurm"})


def test_flags_lay_over_settings_and_an_address_alone_means_ray():
    parser = build_parser()
    for command in (["bench", "x.py"], ["profile", "x.py"], ["optimize", "x.py"]):
        ns = parser.parse_args([*command, "--ray-address", "127.0.0.1:6379"])
        assert executor_settings(Settings(), ns)["kind"] == "ray"
        assert executor_settings(Settings(), ns)["ray_address"] == "127.0.0.1:6379"
    ns = parser.parse_args(["bench", "x.py", "--executor", "local"])
    assert executor_settings(Settings().merged({"executor": "ray", "ray_address": "auto"}), ns)["kind"] == "local"
    kw = executor_settings(Settings().merged({"executor": "ray", "gpu": "H200", "max_gpus": 2}), argparse.Namespace())
    assert kw == {"kind": "ray", "ray_address": None, "gpu": "H200", "max_gpus": 2, "connect_timeout": 30.0}
    assert executor_settings(Settings(), None)["kind"] == "local"


def test_the_command_line_takes_the_ray_connect_timeout_from_the_environment(monkeypatch):
    monkeypatch.setenv("KERNEL_LSP_RAY_CONNECT_TIMEOUT", "150")
    assert executor_settings(Settings(), None)["connect_timeout"] == 150.0
    monkeypatch.setenv("KERNEL_LSP_RAY_CONNECT_TIMEOUT", "soon")  # not a number: the default, not a traceback
    assert executor_settings(Settings(), None)["connect_timeout"] == 30.0


def test_an_evaluation_says_where_it_ran_in_json():
    ev = Evaluation(task="t", candidate="c", executor="ray", node="10.0.0.5 (node abc, GPU 0)")
    assert ev.summary()["executor"] == "ray" and ev.summary()["node"].startswith("10.0.0.5")
    back = Evaluation.from_dict(ev.to_dict())
    assert back.executor == "ray" and back.node == ev.node
    assert Evaluation(task="t", candidate="c").summary()["executor"] == "local"

"""One real Ray cluster on 127.0.0.1 for the whole tests/ray run: a CPU-only head and a second
node declaring two logical GPUs of the kind "CPUTEST" (they run CPU evaluations here).
Started once, always stopped by pid (tests/ray/cluster.py).

This process is the driver. Ray fixes how it resolves 127.0.0.1 when it is imported, so the
loopback settings go into the environment here, before anything imports ray."""

from __future__ import annotations

import os
import secrets

import pytest

from .cluster import LocalCluster, assert_loopback, loopback_env

TOKEN = secrets.token_hex(16)
_SAVED = {k: os.environ.get(k) for k in loopback_env(TOKEN)}
os.environ.update(loopback_env(TOKEN))

pytest.importorskip("ray")
pytest.importorskip("torch")

GPU_KIND = "CPUTEST"
NODE_SECRET = "hf-node-SECRET-4242"   # in the GPU node's own environment: must not reach candidates


@pytest.fixture(scope="session")
def cluster():
    assert_loopback()
    c = LocalCluster(token=TOKEN)
    try:
        c.start_head(num_cpus=1, num_gpus=0)
        c.add_node("gpus", num_cpus=1, num_gpus=2, resources={f"accelerator_type:{GPU_KIND}": 1},
                   env={"HF_TOKEN": NODE_SECRET, "KERNEL_LSP_CACHE": str(c.root / "cache-gpus")})
        yield c
    finally:
        _disconnect()
        c.stop()
        for k, v in _SAVED.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _disconnect() -> None:
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # noqa: BLE001 - the cluster is stopped next anyway
        pass

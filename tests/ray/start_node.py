"""`ray start ...` for tests on 127.0.0.1 (run as `python start_node.py start ARGS`).

With RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (which keeps 127.0.0.1 from being replaced by this
machine's interface address), Ray 2.60's `ray start` refuses to add a worker node to a cluster.
This lifts that one refusal, in the command's own module only: address resolution elsewhere
still sees the setting and stays on the loopback.
"""

import sys
import types

import ray._private.ray_constants as constants
import ray.scripts.scripts as scripts


class _Constants(types.ModuleType):
    def __getattr__(self, name: str):
        return getattr(constants, name)


shim = _Constants("ray_constants")
shim.ENABLE_RAY_CLUSTER = True
scripts.ray_constants = shim

if __name__ == "__main__":
    sys.argv[0] = "ray"
    sys.exit(scripts.main())

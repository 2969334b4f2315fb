"""The generated forward captured whole in a CUDA graph: the variant that removes the per-call host
cost of its launches (the glue between kernels), replayed once per call.

What keeps it honest (docs/cheats.md, "caching across calls", "an output returned twice"):
- each call copies its inputs into the graph's own input buffers and replays: every result is
  computed from this call's inputs, nothing is kept from one call to the next;
- each call returns fresh copies of the graph's outputs, never the graph's storage (which the
  next replay overwrites), so no two calls return the same storage;
- one graph per key: the inputs' shapes, dtypes and devices and the storage of every parameter and
  buffer of the module (a module given new parameter tensors is captured again); the forward's own
  guard still sends other shapes to the reference's forward before any graph is looked at;
- where capture fails (an op that cannot be captured), the plain launches run for that key, and
  for inputs past 256 MiB (copying them would cost more than the launches a graph saves); at most
  four graphs are kept, the oldest dropped first.

The engine still flags the source `cuda_graph` ("replays a CUDA graph the baseline lacks"), and
that flag keeps a candidate from counting: the graph variant is measured and shown, labelled, and
is kept only where the engine's rules let a graph count.
"""

from __future__ import annotations

import re

GRAPHS = '''
# A graph pays off where launches dominate (small inputs); each keeps a copy of its inputs and
# its own memory pool, so inputs past MAX_INPUT_BYTES run the plain launches and at most
# MAX_GRAPHS graphs are kept (the oldest is dropped first).
MAX_INPUT_BYTES = 256 << 20
MAX_GRAPHS = 4


class _Graphs:
    """The whole forward captured once per key in a CUDA graph and replayed once per call: inputs copied
    into the graph's buffers, outputs copied out fresh (no storage returned twice, nothing reused
    across calls). Key: the inputs' shapes, dtypes and devices and the module's parameter and buffer
    storage. Where capture fails, the plain launches run."""

    def __init__(self):
        self.inside = False   # True while the plain launches run (warm-up, capture, fallback)
        self.graphs = {}

    def __call__(self, module, args):
        key = (tuple((a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args),
               tuple(t.data_ptr() for t in module.parameters()), tuple(t.data_ptr() for t in module.buffers()))
        entry = self.graphs.get(key)
        if entry is None:
            while len(self.graphs) >= MAX_GRAPHS:  # the oldest first: each holds input copies and a pool
                self.graphs.pop(next(iter(self.graphs)))
            entry = self.graphs[key] = self._capture(module, args)
        if entry is False:
            return self._plain(module, args)
        graph, static_args, static_out = entry
        for s, a in zip(static_args, args):
            if isinstance(s, torch.Tensor):
                s.copy_(a)
        graph.replay()
        return _fresh(static_out)

    def _plain(self, module, args):
        self.inside = True
        try:
            return module(*args)
        finally:
            self.inside = False

    def _capture(self, module, args):
        if sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor)) > MAX_INPUT_BYTES:
            return False  # copying inputs this large costs more than the launches a graph saves
        static_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            self._plain(module, static_args)  # compiles every kernel before the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            self.inside = True
            with torch.cuda.graph(graph):
                out = module(*static_args)
        except Exception:  # noqa: BLE001 - not capturable: the plain launches stay
            return False
        finally:
            self.inside = False
        return graph, static_args, out


def _fresh(out):
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (tuple, list)):
        return type(out)(_fresh(o) for o in out)
    return out


_GRAPHS = _Graphs()
'''

MARK = "_GRAPHS = _Graphs()"


def is_graphed(source: str) -> bool:
    return MARK in source


def graphed(source: str) -> str | None:
    """`source` (a generated file) with its forward replayed from a CUDA graph; None when it is
    already graphed or is not a generated file."""
    if is_graphed(source) or "\nclass ModelNew(Model):\n" not in source:
        return None
    head, tail = source.split("\nclass ModelNew(Model):\n", 1)
    m = re.search(r"^    def forward\(self(?:, )?([^)]*)\):\n", tail, re.M)
    grad = re.search(r"^        with torch\.no_grad\(\):\n", tail, re.M)
    if m is None or grad is None:
        return None
    args = ", ".join(a.split(":")[0].split("=")[0].strip() for a in m.group(1).split(",") if a.strip())
    call = (f"        if not _GRAPHS.inside:  # one replay of the captured forward per call\n"
            f"            return _GRAPHS(self, ({args}{',' if args and ',' not in args else ''}))\n")
    tail = tail[:grad.start()] + call + tail[grad.start():]
    return head + "\n" + GRAPHS.strip("\n") + "\n\n\nclass ModelNew(Model):\n" + tail

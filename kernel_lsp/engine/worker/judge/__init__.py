"""Is the Candidate correct: the Worker's second stage. Its outputs are checked against a
float64 run of the reference under poisoned memory, fresh input sets and both modes, and its
source is scanned for the cheats of docs/cheats.md; what it finds are verdicts and flags.

- verify.py: the order of checks and the verdict (poisoning, structure, stale results, fallback)
- accuracy.py: how far an output is from the oracle, and what the accuracy budget accepts
- oracle.py: the float64 run of the reference, cached per Worker
- memory_plan.py: where verify keeps its own data (GPU, host, or recomputed)
- recompute.py: the largest Tasks' sets and outputs drawn and computed again when needed
- modes.py: whether the reference differs in training mode, and whether that can be checked
- static_checks.py: the source scan for the patterns of docs/cheats.md
- stream_args.py: which stream CUDA/C++ text launches its work on
"""

"""Build and load a Candidate: the Worker's first stage. A ``.py`` is executed as a fresh module
and a ``.cu`` or ``load_inline`` extension is compiled, each keyed by a content hash so that an
unchanged text loads from the cache; a failed build or launch is explained in one sentence.

- build.py: load_python / load_cuda, the content-hashed build cache and the load_inline hooks
- build_failure.py: what a failed build tells the user (the compiler's first error, or not_run)
- cache.py: where the build cache lives, and its file lock
- fastbuild.py: the fast build of a CUDA extension (device and host units at once, torch's PCH)
- binding.py: load_inline's main.cpp bound by signature (one object per set of types)
- table_binding.py: one main.cpp for every signature of common types (a table, the x86-64 call)
- inline_split.py: split a load_inline CUDA source into a device unit and a host unit
- unit_cache.py: the fast build's objects, kept by content hash
- launch_limits.py: which shared-memory limit a failed launch passed
"""

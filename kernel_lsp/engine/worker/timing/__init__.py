"""How fast is the Candidate: the Worker's third stage, run only for a correct one. The
candidate and its baselines (eager, torch.compile) are timed with timers captured before any
candidate code loads, on a GPU watched for other users, against the hardware's floor, and
profiled to say where the time goes. Named ``timing`` so it never reads like the stdlib ``time``.

- bench.py: time a callable (L2 flush, events, side-stream work), its timers captured at import
- baselines.py: eager and torch.compile times kept between evaluations, and their key
- dry_compile.py: torch.compile's compile of the reference without running it (GPU lent meanwhile)
- gpu_share.py: whether another process used this GPU while we timed
- light.py: speed of light for a measured time (beyond_roofline, algebraic_shortcut)
- roofline.py: the hardware's floor (bandwidth table, bytes any correct kernel must move)
- profile.py: where the time goes (torch.profiler's hot ops, Nsight Compute per kernel)
"""

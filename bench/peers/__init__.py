"""No-op handler modules for bench/bench_workers.py, one per system.

Each peer's module runs only inside that peer's own virtualenv (see
bench_workers.py); none is imported by batonq or its tests.
"""

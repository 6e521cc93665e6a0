"""Running work resumably: append-only logs with a lock, and the executors that fill them.

Shared by benchmark sweeps (:mod:`dapq.bench`), bulk generation (:mod:`dapq.bulk`) and the Ray
integration; it imports none of them.
"""

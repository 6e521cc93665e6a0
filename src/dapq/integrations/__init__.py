"""Bridges to other engines. Import each only where it is used; ``dapq`` itself imports none of
them at import time, and a user without Ray or kvpress never pays for them:

- :mod:`dapq.integrations.ray` (imports Ray): sweeps and bulk generation on Ray actors
  (``--ray``), and ``GenerateBatch`` for Ray Data (``pip install dapq[ray]``);
- :mod:`dapq.integrations.kvpress` (imports kvpress): DapQ as a kvpress press, ``DapQPress``
  (``pip install dapq[peers]``);
- :mod:`dapq.integrations.kvpress_peer` (imports neither): runs kvpress's presses as peers in a
  child process with its own interpreter (``$DAPQ_KVPRESS_PYTHON``), for ``dapq bench``.
"""

"""Bridges to other engines. Each module imports its engine at import time, so import one only
where it is used (``dapq`` itself never imports them):

- :mod:`dapq.integrations.ray`: sweeps and bulk generation on Ray actors, and ``GenerateBatch`` for
  Ray Data (``pip install dapq[ray]``);
- :mod:`dapq.integrations.kvpress`: DapQ as a kvpress press, ``DapQPress`` (``pip install dapq[peers]``).
"""

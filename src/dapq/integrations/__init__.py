"""Bridges to other projects' engines. Each module imports its project; import them explicitly.

- :mod:`dapq.integrations.kvpress`: DapQ as a kvpress press (``DapQPress``).
"""

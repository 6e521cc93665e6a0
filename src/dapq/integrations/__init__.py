"""Bridges to other engines. Each module imports its engine at import time, so import one only
where it is used (``dapq`` itself never imports them): ``dapq.integrations.ray`` needs
``pip install dapq[ray]``."""

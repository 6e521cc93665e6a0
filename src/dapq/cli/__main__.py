"""``python -m dapq.cli``."""

from . import main

main()

"""The sandbox: a lean supervisor that forks one isolated process per program (see `child.py`).

Nothing is imported here on purpose: the supervisor imports this package, and whatever it has
loaded is importable by programs inside the empty root (so `socket` and `subprocess`, which the
runner's side needs, must stay out of it).
"""

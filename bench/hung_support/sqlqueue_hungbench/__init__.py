"""A Django app for ``bench/hung.py``: a consumer whose handler hangs on ``{"hang": true}``.

Outside the ``bench`` package on purpose: ``bench/hung.py --root DIR`` runs another checkout's
engine (an older commit, for a side-by-side run), which has its own ``bench`` package.
"""

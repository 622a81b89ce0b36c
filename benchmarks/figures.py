"""What the benchmarks' figures share: matplotlib on its file backend, imported only when a
figure is drawn (it costs most of a second)."""

from __future__ import annotations


def pyplot():
    """``matplotlib.pyplot`` with the Agg backend, or None where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt

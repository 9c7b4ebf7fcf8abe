"""Tests for tx_helpers.plotting."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from tx_helpers import plotting  # noqa: E402


def _box_order(ax):
    """Box labels from bottom to top (boxes are the Text objects with a bbox)."""
    boxes = [t for t in ax.texts if t.get_bbox_patch() is not None]
    return [t.get_text() for t in sorted(boxes, key=lambda t: t.get_position()[1])]


@pytest.mark.parametrize("norm_first, expected", [
    (False, ["sublayer", "Dropout", "+", "LayerNorm"]),
    (True, ["LayerNorm", "sublayer", "Dropout", "+"]),
])
def test_plot_sublayer_diagram_order(norm_first, expected):
    fig, ax = plt.subplots()
    out = plotting.plot_sublayer_diagram(norm_first, ax, sublayer="sublayer")
    assert out is ax
    assert _box_order(ax) == expected
    assert ("Pre-LN" in ax.get_title()) == norm_first
    plt.close(fig)


def test_plot_sublayer_diagram_creates_axes():
    ax = plotting.plot_sublayer_diagram()
    assert any("LayerNorm" == t.get_text() for t in ax.texts)
    plt.close(ax.figure)

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


def _tick_sizes(fig):
    return [t.get_fontsize() for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()
            if t.get_text()]


def test_plot_heads_shares_one_labelled_colour_scale():
    import numpy as np
    weights = np.random.default_rng(0).dirichlet(np.ones(5), size=(3, 4))  # (H, L_q, L_k)
    weights[1] *= 0.5  # a head with smaller weights must look paler, not be rescaled
    fig = plotting.plot_heads(weights, q_labels=list("abcd"), k_labels=list("vwxyz"),
                              colorbar=True)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 3
    assert {im.get_clim() for im in images} == {(0.0, float(weights.max()))}
    colorbars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(colorbars) == 1 and "attention weight" in colorbars[0].get_ylabel()
    assert min(_tick_sizes(fig)) >= plotting.MIN_FONT
    plt.close(fig)


def test_plot_mask_says_what_dark_means():
    import torch
    fig, ax = plt.subplots()
    plotting.plot_mask(torch.triu(torch.ones(3, 3, dtype=torch.bool), 1), ax)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["True: do not attend", "False: may attend"]
    assert ax.get_xlabel() and ax.get_ylabel()
    fig2, axes = plt.subplots(1, 2)
    for a in axes:
        plotting.plot_mask(torch.zeros(2, 2, dtype=torch.bool), a, legend=False)
        assert a.get_legend() is None
    legend = plotting.mask_legend(fig2)
    assert [t.get_text() for t in legend.get_texts()] == labels
    plt.close(fig)
    plt.close(fig2)


def test_plot_attention_colorbar_is_labelled():
    import numpy as np
    fig, ax = plt.subplots()
    plotting.plot_attention(np.full((2, 3), 1 / 3), ax)
    colorbars = [a for a in fig.axes if a.get_label() == "<colorbar>"]
    assert len(colorbars) == 1 and colorbars[0].get_ylabel() == "attention weight"
    plt.close(fig)


def test_plot_heads_without_colorbar_keeps_its_size():
    """Notebooks compare the figure's repr, '<Figure size WxH with N Axes>': the default is
    unchanged (one Axes per head, size * ncols wide)."""
    import numpy as np
    fig = plotting.plot_heads(np.full((4, 2, 3), 1 / 3), ncols=4, size=3.0)
    assert len(fig.axes) == 4 and tuple(fig.get_size_inches()) == (12.0, 3.0)
    plt.close(fig)


def _diagram_texts(ax):
    return " | ".join(t.get_text() for t in ax.texts)


def test_plot_transformer_diagram_names_modules_and_notebooks():
    fig, ax = plt.subplots()
    assert plotting.plot_transformer_diagram(ax=ax) is ax
    text = _diagram_texts(ax)
    for module, notebook in [("encoder.embedding", "[06]"), ("encoder.pos_encoding", "[02]"),
                             ("self_attn: MultiHeadAttention", "[03]"), ("cross_attn", "[03]"),
                             ("feed_forward: FeedForward", "[04]"), ("generator", "[07]")]:
        assert module in text and notebook in text
    assert "(N, L_src, d_model)" in text and "(N, L_tgt, tgt_vocab)" in text  # symbolic by default
    assert text.count("not in the 2017 paper") == 2  # tx's final norms are not drawn as the paper's
    plt.close(fig)


def test_plot_transformer_diagram_reads_shapes_from_a_trace():
    import torch

    import tx_helpers as tx
    model = tx.Transformer(tx.ModelConfig(tgt_vocab_size=100)).eval()
    src, tgt = torch.randint(2, 128, (3, 9)), torch.randint(2, 100, (3, 6))
    shapes = plotting.transformer_diagram_shapes(tx.trace_shapes(model, src, tgt, max_depth=3))
    assert shapes == {"src": "(3, 9)", "tgt": "(3, 6)", "src_x": "(3, 9, 128)",
                      "tgt_x": "(3, 6, 128)", "memory": "(3, 9, 128)", "dec_out": "(3, 6, 128)",
                      "src_mask": "(3, 1, 9)",
                      "tgt_mask": "(3, 6, 6)", "logits": "(3, 6, 100)"}
    ax = plotting.plot_transformer_diagram(tx.trace_shapes(model, src, tgt))
    text = _diagram_texts(ax)
    assert "memory (3, 9, 128)" in text and "logits (3, 6, 100)" in text and "(3, 6, 6)" in text
    plt.close(ax.figure)


def test_plot_transformer_diagram_rejects_what_is_not_a_model_trace():
    import torch

    import tx_helpers as tx
    with pytest.raises(TypeError, match="trace must be a ShapeTrace"):
        plotting.plot_transformer_diagram({"src": "(1, 2)"})
    layer_trace = tx.trace_shapes(tx.FeedForward(8, 16, 0.0), torch.zeros(1, 2, 8))
    with pytest.raises(ValueError, match="whole Transformer"):
        plotting.plot_transformer_diagram(layer_trace)

"""Small matplotlib helpers shared by the notebooks: heatmaps of masks and attention."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import Patch

MIN_FONT = 8  # tick labels and annotations: readable at 100% zoom
_MASK_CMAP, _MASK_VMAX = "Greys", 1.4  # True (1) -> dark grey, False (0) -> white


def _to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype == torch.bool:
            x = x.to(torch.uint8)
        x = x.float().numpy()
    return np.asarray(x)


def plot_heatmap(data, ax=None, *, title=None, xlabel=None, ylabel=None, xticklabels=None,
                 yticklabels=None, cmap="viridis", vmin=None, vmax=None, colorbar=True,
                 annotate=False, fmt="{:.2f}", cbar_label=None):
    """Draw a 2-D array as an image with labelled axes; returns the Axes.

    ``cbar_label`` names what the colour encodes (shown on the colorbar).
    """
    arr = _to_numpy(data)
    if arr.ndim != 2:
        raise ValueError(f"plot_heatmap needs a 2-D array, got shape {arr.shape}")
    if ax is None:
        _, ax = plt.subplots()
    im = ax.imshow(arr, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    if xticklabels is not None:
        ax.set_xticks(range(len(xticklabels)), [str(t) for t in xticklabels])
    if yticklabels is not None:
        ax.set_yticks(range(len(yticklabels)), [str(t) for t in yticklabels])
    if annotate:
        mid = (np.nanmax(arr) + np.nanmin(arr)) / 2
        for (i, j), val in np.ndenumerate(arr):
            ax.text(j, i, fmt.format(val), ha="center", va="center", fontsize=MIN_FONT,
                    color="black" if val > mid else "white")
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if colorbar:
        cbar = ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        if cbar_label:
            cbar.set_label(cbar_label)
    return ax


def mask_legend_handles():
    """Legend entries for :func:`plot_mask`: dark = True = "do not attend"."""
    cmap = plt.get_cmap(_MASK_CMAP)
    return [Patch(facecolor=cmap(1 / _MASK_VMAX), edgecolor="black", label='True: do not attend'),
            Patch(facecolor=cmap(0.0), edgecolor="black", label="False: may attend")]


def mask_legend(fig, **kwargs):
    """One legend for a figure of mask panels, above the panels; returns the Legend."""
    opts = dict(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    opts.update(kwargs)
    return fig.legend(handles=mask_legend_handles(), **opts)


def plot_mask(mask, ax=None, *, q_labels=None, k_labels=None, title=None, legend=True):
    """Show a 2-D bool mask: dark = True = "do not attend", light = may attend.

    ``legend=True`` puts that key beside the Axes; for several panels pass
    ``legend=False`` and call :func:`mask_legend` once on the figure.
    """
    arr = _to_numpy(mask)
    ax = plot_heatmap(arr, ax, title=title, xlabel="key position (attended to)",
                      ylabel="query position (attending)", xticklabels=k_labels,
                      yticklabels=q_labels, cmap=_MASK_CMAP, vmin=0, vmax=_MASK_VMAX,
                      colorbar=False)
    ax.set_xticks(np.arange(-0.5, arr.shape[1]), minor=True)
    ax.set_yticks(np.arange(-0.5, arr.shape[0]), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    if legend:
        ax.legend(handles=mask_legend_handles(), loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  frameon=False, fontsize=MIN_FONT)
    return ax


def plot_attention(weights, ax=None, *, q_labels=None, k_labels=None, title=None,
                   annotate=False, colorbar=True, vmax=None):
    """Show one (L_q, L_k) attention matrix; each row sums to 1."""
    return plot_heatmap(weights, ax, title=title, xlabel="key", ylabel="query",
                        xticklabels=k_labels, yticklabels=q_labels, cmap="viridis",
                        vmin=0, vmax=vmax, annotate=annotate, colorbar=colorbar,
                        cbar_label="attention weight")


def plot_heads(weights, *, q_labels=None, k_labels=None, ncols=4, title=None, size=2.2,
               vmax=None, colorbar=False):
    """One small heatmap per head for weights of shape (H, L_q, L_k); returns the Figure.

    All heads share one colour scale, 0 to ``vmax`` (default: the largest weight of
    any head), so colours compare across heads. ``colorbar=True`` adds one labelled
    colorbar for all of them (the figure is then 0.8 inch wider and has one more Axes).
    """
    arr = _to_numpy(weights)
    if arr.ndim != 3:
        raise ValueError(f"plot_heads needs weights of shape (H, L_q, L_k), got {arr.shape}")
    n_heads = arr.shape[0]
    ncols = min(ncols, n_heads)
    nrows = -(-n_heads // ncols)
    vmax = float(arr.max()) if vmax is None else vmax
    width = size * ncols + (0.8 if colorbar else 0.0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, size * nrows),
                             squeeze=False, layout="constrained")
    for h, ax in enumerate(axes.flat):
        if h >= n_heads:
            ax.axis("off")
            continue
        plot_attention(arr[h], ax, q_labels=q_labels, k_labels=k_labels,
                       title=f"head {h}", colorbar=False, vmax=vmax)
        if h % ncols:
            ax.set_ylabel("")
        if h < n_heads - ncols:
            ax.set_xlabel("")
        ax.tick_params(labelsize=MIN_FONT)
    if colorbar:
        cbar = fig.colorbar(axes.flat[0].images[0], ax=axes, shrink=0.9,
                            label="attention weight (all heads)")
        cbar.ax.tick_params(labelsize=MIN_FONT)
    if title:
        fig.suptitle(title)
    return fig


def plot_sublayer_diagram(norm_first=False, ax=None, *, sublayer="sublayer (attention or FFN)"):
    """Draw one residual sublayer as boxes and arrows, input at the bottom; returns the Axes.

    ``norm_first=False`` (Post-LN, the 2017 paper): out = LayerNorm(x + Dropout(sublayer(x))).
    ``norm_first=True`` (Pre-LN): out = x + Dropout(sublayer(LayerNorm(x))).
    Each box is a ``Text`` whose label names the step, so tests can read the order.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(2.8, 3.6))
    steps = ["LayerNorm", sublayer, "Dropout", "+"] if norm_first else \
        [sublayer, "Dropout", "+", "LayerNorm"]
    ys = np.linspace(0.16, 0.84, len(steps) + 1)[1:] - 0.04
    col, res = 0.42, 0.88
    ax.text(col, 0.03, "x (N, L, d_model)", ha="center", va="center", fontsize=8)
    ax.text(col, 0.99, "out (N, L, d_model)", ha="center", va="center", fontsize=8)
    colours = {"LayerNorm": "#f6d38c", "Dropout": "#d9d9d9", "+": "white"}
    prev = 0.06
    for step, y in zip(steps, ys, strict=True):
        ax.annotate("", xy=(col, y - 0.045), xytext=(col, prev),
                    arrowprops={"arrowstyle": "->", "lw": 1.0})
        box = "circle,pad=0.25" if step == "+" else "round,pad=0.35"
        ax.text(col, y, step, ha="center", va="center", fontsize=8,
                bbox={"boxstyle": box, "fc": colours.get(step, "#9ecae1"), "ec": "black"})
        prev = y + 0.045
    ax.annotate("", xy=(col, 0.96), xytext=(col, prev), arrowprops={"arrowstyle": "->", "lw": 1.0})
    y_plus = ys[steps.index("+")]
    ax.plot([col, res, res], [0.1, 0.1, y_plus], color="tab:red", lw=1.0)
    ax.annotate("", xy=(col + 0.05, y_plus), xytext=(res, y_plus),
                arrowprops={"arrowstyle": "->", "lw": 1.0, "color": "tab:red"})
    ax.text(res + 0.02, (0.1 + y_plus) / 2, "residual", rotation=90, ha="left", va="center",
            fontsize=MIN_FONT, color="tab:red")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.axis("off")
    ax.set_title("Pre-LN (norm_first=True)" if norm_first else "Post-LN (norm_first=False)")
    return ax


def _trace_shapes_by_name(trace) -> dict:
    """name -> (list of input-shape strings, output-shape string) from a ShapeTrace's rows."""
    found = {}
    for name, _kind, inputs, output in trace.rows:
        parts = inputs.split("), (") if inputs else []
        parts = [("" if p.startswith("(") else "(") + p + ("" if p.endswith(")") else ")")
                 for p in parts]
        found.setdefault(name, (parts, output))
    return found


_SYMBOLIC_SHAPES = {
    "src": "(N, L_src)", "tgt": "(N, L_tgt)", "src_x": "(N, L_src, d_model)",
    "tgt_x": "(N, L_tgt, d_model)", "memory": "(N, L_src, d_model)",
    "dec_out": "(N, L_tgt, d_model)",
    "src_mask": "(N, 1, L_src)", "tgt_mask": "(N, L_tgt, L_tgt)",
    "logits": "(N, L_tgt, tgt_vocab)",
}


def transformer_diagram_shapes(trace=None) -> dict:
    """The tensor shapes :func:`plot_transformer_diagram` writes beside its arrows.

    Without a trace: symbolic shapes such as ``(N, L_src, d_model)``. With a
    :class:`tx_helpers.introspection.ShapeTrace` of a whole ``Transformer`` (from
    ``tx.trace_shapes(model, src, tgt)``): the shapes that run actually had.
    """
    if trace is None:
        return dict(_SYMBOLIC_SHAPES)
    if not hasattr(trace, "rows"):
        raise TypeError("trace must be a ShapeTrace from tx.trace_shapes(model, src, tgt) or "
                        f"None, got {type(trace).__name__}")
    rows = _trace_shapes_by_name(trace)
    needed = ("encoder", "decoder", "encoder.embedding", "decoder.embedding", "generator")
    missing = [n for n in needed if n not in rows]
    if missing:
        raise ValueError("trace must come from a whole Transformer (tx.trace_shapes(model, src, "
                         f"tgt)); it has no rows for {missing}")
    enc_in, memory = rows["encoder"]
    dec_in, _ = rows["decoder"]
    return {
        "src": rows["encoder.embedding"][0][0], "tgt": rows["decoder.embedding"][0][0],
        "src_x": rows["encoder.embedding"][1], "tgt_x": rows["decoder.embedding"][1],
        "memory": memory, "dec_out": rows["decoder"][1],
        "src_mask": enc_in[1] if len(enc_in) > 1 else "none",
        "tgt_mask": dec_in[2] if len(dec_in) > 2 else "none", "logits": rows["generator"][1],
    }


def plot_transformer_diagram(trace=None, ax=None):
    """The encoder-decoder Transformer as boxes and arrows, in the layout of the paper's Figure 1.

    Every box names the ``tx`` module that computes it (``encoder.layers[i].self_attn`` ...)
    and, in brackets, the notebook of this series that builds it. Arrows carry tensor shapes:
    symbolic ones by default, or the real ones of a run when ``trace`` is a ShapeTrace of a
    whole ``tx.Transformer`` (``tx.trace_shapes(model, src, tgt)``). Returns the Axes.
    """
    shapes = transformer_diagram_shapes(trace)
    if ax is None:
        _, ax = plt.subplots(figsize=(10.5, 8.8))
    colour = {"emb": "#fcbba1", "pe": "#fee6ce", "attn": "#9ecae1", "norm": "#f6d38c",
              "ffn": "#a1d99b", "gen": "#dadaeb", "out": "#efefef"}
    width, height = 4.5, 0.66

    def box(x, y, text, kind):
        ax.add_patch(plt.Rectangle((x - width / 2, y - height / 2), width, height, fc=colour[kind],
                                   ec="black", lw=0.8, zorder=2))
        ax.text(x, y, text, ha="center", va="center", fontsize=MIN_FONT + 0.5, zorder=3,
                bbox={"boxstyle": "square,pad=0", "fc": "none", "ec": "none"})

    def arrow(x0, y0, x1, y1, **kw):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "->", "lw": 1.0, **kw}, zorder=1)

    def shape_label(x, y, text, side=1):
        ax.text(x + side * 0.12, y, text, ha="left" if side > 0 else "right", va="center",
                fontsize=MIN_FONT, color="#7f2704", style="italic")

    def column(x, side, rows, first_y, frame, frame_label):
        """Draw a stack of (text, kind) boxes upwards from first_y; return their centres."""
        ys = []
        y = first_y
        for text, kind in rows:
            box(x, y, text, kind)
            ys.append(y)
            y += 1.0
        for y0, y1 in zip(ys, ys[1:], strict=False):
            arrow(x, y0 + height / 2, x, y1 - height / 2)
        lo, hi = ys[frame[0]] - 0.55, ys[frame[1]] + 0.5
        ax.add_patch(plt.Rectangle((x - width / 2 - 0.5, lo), width + 1.0, hi - lo, fc="none",
                                   ec="0.35", lw=1.0, ls="--", zorder=0))
        ax.text(x - side * (width / 2 + 0.75), (lo + hi) / 2, frame_label, rotation=90,
                ha="center", va="center", fontsize=MIN_FONT + 0.5, color="0.25")
        # residual connections: from below each sub-layer to its Add & Norm, on the outer side
        rx = x - side * (width / 2 + 0.2)
        for i in range(frame[0], frame[1], 2):
            y_from, y_to = ys[i] - 0.5, ys[i + 1]
            ax.plot([x, rx, rx], [y_from, y_from, y_to], color="tab:red", lw=1.0, zorder=1)
            arrow(rx, y_to, x - side * width / 2, y_to, color="tab:red")
        return ys

    xe, xd = 2.6, 8.5
    enc = column(xe, 1, [
        ("encoder.embedding × √d_model  [06]", "emb"),
        ("+ encoder.pos_encoding  [02]", "pe"),
        ("self_attn: MultiHeadAttention  [03]\nmask " + shapes["src_mask"] + "  [05]", "attn"),
        ("Add & norm1  [04]", "norm"),
        ("feed_forward: FeedForward  [04]", "ffn"),
        ("Add & norm2  [04]", "norm"),
        ("encoder.norm: final LayerNorm  [06]\n(tx only: not in the 2017 paper)", "norm"),
    ], 1.4, (2, 5), "encoder.layers: n_layers × EncoderLayer  [06]")
    dec = column(xd, -1, [
        ("decoder.embedding × √d_model  [06]", "emb"),
        ("+ decoder.pos_encoding  [02]", "pe"),
        ("self_attn: MultiHeadAttention  [03]\n"
         "look-ahead + padding mask " + shapes["tgt_mask"] + "  [05]", "attn"),
        ("Add & norm1  [04]", "norm"),
        ("cross_attn: keys and values = memory  [03]\nmask " + shapes["src_mask"] + "  [05]",
         "attn"),
        ("Add & norm2  [04]", "norm"),
        ("feed_forward: FeedForward  [04]", "ffn"),
        ("Add & norm3  [04]", "norm"),
        ("decoder.norm: final LayerNorm  [06]\n(tx only: not in the 2017 paper)", "norm"),
        ("generator: Linear(d_model, tgt_vocab)  [07]", "gen"),
        ("softmax: next-token probabilities  [08, 09]", "out"),
    ], 1.4, (2, 7), "decoder.layers: n_layers × DecoderLayer  [06]")

    # inputs at the bottom, with their shapes
    for x, ys, label, key in ((xe, enc, "source token ids", "src"),
                              (xd, dec, "target token ids, shifted right  [08]", "tgt")):
        ax.text(x, 0.35, label, ha="center", va="center", fontsize=MIN_FONT + 0.5)
        arrow(x, 0.55, x, ys[0] - height / 2)
        shape_label(x, 0.82, shapes[key])
    shape_label(xe, enc[0] + 0.5, shapes["src_x"])
    shape_label(xd, dec[0] + 0.5, shapes["tgt_x"], side=-1)
    shape_label(xd, dec[-3] + 0.5, shapes["dec_out"], side=-1)

    # memory: from the top of the encoder to every decoder layer's cross_attn
    top = enc[-1] + height / 2
    ax.plot([xe, xe, 5.55, 5.55], [top, top + 0.45, top + 0.45, dec[4]], color="tab:blue", lw=1.4,
            zorder=1)
    arrow(5.55, dec[4], xd - width / 2, dec[4], color="tab:blue", lw=1.4)
    ax.text(xe, top + 0.75, "memory " + shapes["memory"] + ": one vector per source token,\n"
            "read by the cross_attn of every decoder layer", ha="center", va="center",
            fontsize=MIN_FONT + 0.5, color="tab:blue")
    # output at the top
    ax.text(xd, dec[-1] + 0.85, "a distribution over the target vocabulary, per target position",
            ha="center", va="center", fontsize=MIN_FONT + 0.5)
    arrow(xd, dec[-1] + height / 2, xd, dec[-1] + 0.7)
    shape_label(xd, dec[-2] + 0.5, "logits " + shapes["logits"], side=-1)

    ax.text(-0.8, 13.7, "[NN] = the notebook of this series that builds the part\n"
            "Add & norm = LayerNorm(x + dropout(sublayer(x))), in red: the residual x\n"
            "pos_encoding: a fixed sinusoidal table;  italic: tensor shapes", ha="left", va="top",
            fontsize=MIN_FONT + 0.5)
    ax.set_xlim(-0.9, 11.8)
    ax.set_ylim(0, 13.8)
    ax.axis("off")
    ax.set_title("The encoder-decoder Transformer (after Figure 1 of Vaswani et al., 2017)")
    return ax

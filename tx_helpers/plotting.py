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

"""Human-readable views of a partition: a text table and a stacked-bar plot.

Label counts are the labels each client trains and tests on, i.e. after its label
permutation (label-swap), over train and test together.
"""

from __future__ import annotations

import numpy as np

from .partition_base import ClientPartition, Partition

# Dark colours for groups, so they stand out against the label fills.
_GROUP_COLOURS = (
    "#000000", "#b00020", "#0033cc", "#00703c", "#cc5500", "#6a1b9a",
    "#5d4037", "#00838f", "#ad1457", "#827717",
)


def _client_label_counts(client: ClientPartition, labels: np.ndarray, num_classes: int) -> np.ndarray:
    y = labels[np.concatenate([client.train_idx, client.test_idx]).astype(np.int64)]
    if client.label_perm is not None:
        y = np.asarray(client.label_perm)[y]
    return np.bincount(y, minlength=num_classes)


def label_count_matrix(part: Partition, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(clients, classes) sample counts, train + test."""
    labels = np.asarray(labels, dtype=np.int64)
    return np.stack([_client_label_counts(c, labels, num_classes) for c in part.clients])


def partition_table(part: Partition, labels: np.ndarray, num_classes: int) -> str:
    """One row per client: client, group, n_train, n_test, rotation, count of each label."""
    counts = label_count_matrix(part, labels, num_classes)
    header = ["client", "group", "n_train", "n_test", "rotation"] + [f"y{k}" for k in range(num_classes)]
    rows = [
        [str(i), str(c.group), str(len(c.train_idx)), str(len(c.test_idx)), f"{c.rotation:g}"]
        + [str(v) for v in counts[i]]
        for i, c in enumerate(part.clients)
    ]
    widths = [max(len(h), *(len(r[j]) for r in rows)) for j, h in enumerate(header)]
    lines = [
        f"partition {part.name!r}: {len(part.clients)} clients, {part.num_groups} groups",
        "  ".join(h.rjust(w) for h, w in zip(header, widths)),
    ]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    if any(c.label_perm is not None for c in part.clients):
        lines.append("label permutations (y -> perm[y]) by group:")
        shown: set[int] = set()
        for c in part.clients:
            if c.label_perm is not None and c.group not in shown:
                shown.add(c.group)
                lines.append(f"  group {c.group}: {' '.join(str(int(v)) for v in c.label_perm)}")
    return "\n".join(lines)


def plot_partition(part: Partition, labels: np.ndarray, num_classes: int, path) -> None:
    """Save a stacked bar chart of label counts per client; outline and x tick label of
    each bar are coloured by the client's ground-truth group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    counts = label_count_matrix(part, labels, num_classes)
    m = len(part.clients)
    groups = part.groups()
    fills = plt.get_cmap("tab10" if num_classes <= 10 else "tab20" if num_classes <= 20 else "turbo")
    fill_of = [fills(k if num_classes <= 20 else k / max(num_classes - 1, 1)) for k in range(num_classes)]
    edge_of = [_GROUP_COLOURS[g % len(_GROUP_COLOURS)] for g in groups]

    fig, ax = plt.subplots(figsize=(min(max(7.0, 0.16 * m + 3.0), 40.0), 4.5))
    x = np.arange(m)
    bottom = np.zeros(m)
    for k in range(num_classes):
        ax.bar(x, counts[:, k], bottom=bottom, color=fill_of[k], width=0.8, linewidth=0)
        bottom += counts[:, k]
    # Outline each whole bar in its group colour (drawn once, over the stacked segments).
    ax.bar(x, bottom, width=0.8, fill=False, edgecolor=edge_of, linewidth=1.6)

    ax.set_xticks(x)
    ax.set_xticklabels([str(i) for i in x], fontsize=7 if m <= 50 else 5, rotation=90 if m > 30 else 0)
    for tick, colour in zip(ax.get_xticklabels(), edge_of):
        tick.set_color(colour)
        tick.set_fontweight("bold")
    ax.set_xlim(-0.7, m - 0.3)
    ax.set_xlabel("client (tick and outline colour = ground-truth group)")
    ax.set_ylabel("samples (train + test)")
    ax.set_title(f"partition '{part.name}': {m} clients, {part.num_groups} groups")

    label_handles = [Patch(facecolor=fill_of[k], label=str(k)) for k in range(num_classes)]
    leg = ax.legend(
        handles=label_handles, title="label", loc="upper left", bbox_to_anchor=(1.01, 1.0),
        fontsize=7, title_fontsize=8, ncol=1 if num_classes <= 13 else 2,
    )
    ax.add_artist(leg)
    present = sorted(set(groups.tolist()))
    group_handles = [
        Patch(facecolor="white", edgecolor=_GROUP_COLOURS[g % len(_GROUP_COLOURS)], linewidth=1.6, label=str(g))
        for g in present[:20]
    ]
    ax.legend(
        handles=group_handles, title="group", loc="lower left", bbox_to_anchor=(1.01, 0.0),
        fontsize=7, title_fontsize=8, ncol=1 if len(group_handles) <= 8 else 2,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

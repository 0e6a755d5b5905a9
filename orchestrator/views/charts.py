"""The loss curve: as a terminal chart (block characters) and as a PNG (matplotlib, the `plot` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.errors import UserError

BLOCKS = " ▁▂▃▄▅▆▇█"
MARK = "▲"


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def _buckets(curve: Sequence[Sequence[float]], columns: int) -> list[tuple[float, float, float]]:
    """(first step, last step, mean loss) for `columns` equal slices of the curve."""
    n = len(curve)
    out = []
    for c in range(columns):
        lo, hi = c * n // columns, max(c * n // columns + 1, (c + 1) * n // columns)
        part = curve[lo:hi]
        out.append((part[0][0], part[-1][0], sum(p[1] for p in part) / len(part)))
    return out


def loss_chart(
    curve: Sequence[Sequence[float]], width: int, height: int = 6, markers: Sequence[int] = ()
) -> list[str]:
    """A filled area chart of loss by step, `width` characters wide; preemptions marked below."""
    if not curve:
        return ["(no loss logged yet)"]
    values = [p[1] for p in curve]
    hi, lo = max(values), min(values)
    labels = [_fmt(hi), _fmt(lo)]
    pad = max(len(s) for s in labels)
    columns = max(1, min(len(curve), width - pad - 2))
    buckets = _buckets(curve, columns)
    span = (hi - lo) or 1.0
    levels = [max(1, round((b[2] - lo) / span * (height * 8 - 1)) + 1) for b in buckets]
    lines = []
    for row in range(height - 1, -1, -1):
        cells = "".join(BLOCKS[min(8, max(0, level - row * 8))] for level in levels)
        label = labels[0] if row == height - 1 else labels[1] if row == 0 else ""
        lines.append(f"{label:>{pad}} {'┤' if label else '│'}{cells}")
    axis = ["─"] * columns
    for step in markers:
        for i, (first, last, _v) in enumerate(buckets):
            if first <= step <= last or (i + 1 < columns and last < step < buckets[i + 1][0]):
                axis[i] = MARK
                break
    lines.append(f"{'':>{pad}} └{''.join(axis)}")
    first, last = str(int(curve[0][0])), str(int(curve[-1][0]))
    legend = f" {MARK} preempted" if markers else ""
    gap = columns - len(first) - len(last)
    middle = legend.center(gap) if gap > len(legend) + 1 else " " * max(1, gap)
    lines.append(f"{'':>{pad}}  {first}{middle}{last}" if gap > 0 else f"{'':>{pad}}  {first}..{last}")
    return lines


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_target(path: str) -> str:
    """The file `--plot` will write, checked before anything is read (one line, exit 2, if wrong)."""
    import os

    if os.path.isdir(path):
        raise UserError(f"--plot: {path} is a folder; give a file name such as {path.rstrip('/')}/loss.png")
    if not path.lower().endswith(PLOT_SUFFIXES):
        raise UserError(f"--plot: {path!r} must be a file name ending in {', '.join(PLOT_SUFFIXES)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"--plot: the folder {folder} does not exist (for {path})")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UserError(f"--plot: cannot write {path} (permission denied)")
    return path


def plot_png(detail: dict[str, Any], path: str) -> str:
    """Write the loss curve with preemption markers and the cost line to a PNG; returns the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot: needs matplotlib; pip install 'ftorch[plot]'") from None
    curve = detail.get("loss_curve") or []
    if not curve:
        raise UserError(f"--plot: {detail['job_id']} has no loss logged yet")
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    ax.plot([p[0] for p in curve], [p[1] for p in curve], color="#1f77b4", lw=1.4, label="training loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    for i, step in enumerate(detail.get("preemption_steps") or []):
        ax.axvline(step, color="#d62728", ls="--", lw=1, label="preemption" if i == 0 else None)
    costs = detail.get("cost_curve") or []
    handles, labels = ax.get_legend_handles_labels()
    if costs:
        ax2 = ax.twinx()
        ax2.plot([p[0] for p in costs], [p[1] for p in costs], color="#2ca02c", lw=1.2, label="cost so far")
        ax2.set_ylabel("cost (USD)")
        ax2.set_ylim(bottom=0)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="upper right", fontsize=8)
    ax.set_title(f"{detail['job_id']} ({detail['state']}): loss, preemptions, cost", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise UserError(f"--plot: cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return path

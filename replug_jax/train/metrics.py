"""Training metrics: DIR/metrics.jsonl (one JSON object per logged step), TensorBoard event
files (tensorboardX: no TensorFlow needed) and a plot of the loss curve."""
from __future__ import annotations

import json
import os


class MetricsLogger:
    """Appends metrics; on resume, drops lines past the restored step so each step appears once."""

    def __init__(self, workdir: str, resume_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.writer = None
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        if os.path.isfile(self.path):
            with open(self.path) as f:
                kept = [line for line in f if line.strip() and json.loads(line)["step"] <= resume_step]
            with open(self.path, "w") as f:
                f.writelines(kept)
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=resume_step + 1)

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _plain(value):
    try:
        return value.item()  # numpy / jax scalars
    except AttributeError:
        return value


def read_metrics(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_loss(workdir: str) -> str:
    """DIR/loss.png: the LSR loss per step, with index refreshes marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(workdir)
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="KL loss")
    for r in rows:
        if r.get("refresh_swapped"):
            ax.axvline(r["step"], color="gray", linestyle=":", linewidth=1)
    ax.set_xlabel("step (dotted: index refresh swapped in)")
    ax.set_ylabel("loss")
    ax.set_title("REPLUG LSR training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(workdir, "loss.png")
    fig.savefig(path)
    plt.close(fig)
    return path

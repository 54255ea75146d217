"""The plan as a picture: a stacked area of the mix over budget tokens, phase boundaries and drains marked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tokenloom.formats.io import require

__all__ = ["plot_plan"]


def plot_plan(plan: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """A stacked area of the mix over budget tokens, phase boundaries and drain points marked."""
    matplotlib = require("matplotlib", distribution="tokenloom-curriculum", extra="plot", purpose="plan --plot")
    matplotlib.use("Agg")
    pyplot = require("matplotlib.pyplot", distribution="tokenloom-curriculum", extra="plot", purpose="plan --plot")
    names = [b["name"] for b in plan["buckets"]]
    xs: list[float] = []
    ys: list[list[float]] = [[] for _ in names]
    for segment in plan["segments"]:
        for x in (segment["start_token"], segment["end_token"]):
            xs.append(x)
            for i, name in enumerate(names):
                ys[i].append(segment["weights"].get(name, 0.0))
    figure, axes = pyplot.subplots(figsize=(9, 4.5))
    scale, unit = _scale(max(xs) if xs else 1)
    colours = pyplot.get_cmap("tab10")
    axes.stackplot(
        np.asarray(xs) / scale, np.asarray(ys), labels=names, colors=[colours(i % 10) for i in range(len(names))]
    )
    for phase in plan["phases"][1:]:
        start = _token_at(plan, phase["start_sample"])
        axes.axvline(start / scale, color="black", linewidth=1, linestyle="--")
    for phase in plan["phases"]:
        if phase["samples"] == 0:
            continue
        middle = (_token_at(plan, phase["start_sample"]) + _token_at(plan, phase["end_sample"])) / 2
        axes.text(middle / scale, 1.02, f"phase {phase['index']}", ha="center", va="bottom", fontsize=8)
    for number, drain in enumerate(plan["drains"]):
        axes.axvline(drain["token"] / scale, color="red", linewidth=1.5)
        axes.annotate(
            f"{drain['bucket']} dry ({drain['effect']})",
            xy=(drain["token"] / scale, 0.1 + 0.2 * (number % 4)),
            xytext=(-4, 0),
            textcoords="offset points",
            ha="right",
            color="white",
            fontsize=8,
            bbox={"boxstyle": "round", "facecolor": "red", "edgecolor": "none"},
        )
    axes.set_xlim(0, (max(xs) if xs else 1) / scale)
    axes.set_ylim(0, 1.08)
    axes.set_xlabel(f"budget tokens ({unit})")
    axes.set_ylabel("share of tokens")
    title = f"curriculum plan: {plan['samples']:,} samples, policy {plan['policy']}"
    if plan["ended_early"]:
        title += f"\nended early: {plan['ended_early']}"
    axes.set_title(title, fontsize=9, pad=14)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return Path(path)


def _token_at(plan: dict[str, Any], sample: int) -> int:
    for segment in plan["segments"]:
        if segment["start_sample"] == sample:
            return segment["start_token"]
        if segment["end_sample"] == sample:
            return segment["end_token"]
    return plan["tokens"] if sample >= plan["samples"] else 0


def _scale(largest: float) -> tuple[float, str]:
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if largest >= scale:
            return scale, unit
    return 1.0, "tokens"

#!/usr/bin/env python3
"""Plots a qksoftmax bench results file (docs/SPEC.md, section 7).

For each suite of the JSON, one PNG with two panels, one series per (impl, mode) (and dtype, when the suite
has several): % SOL per case, and latency per case (µs, log scale). Saved next to the JSON as
<stem>-<suite>.png.

    python3 bench/plot.py bench/results/h200.json
"""
import argparse
import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

SHAPE_KEYS = ("B", "H", "S", "D")
FIGURE_HEIGHT = 8.0
MIN_FIGURE_WIDTH = 8.0
WIDTH_PER_CASE = 0.55
LEGEND_WIDTH = 3.5
DPI = 120
# One colour per implementation, one line style and marker per mode.
MODE_STYLES = {"forward": (":", "s"), "recompute": ("-", "o"), "recompute_lse": ("-.", "D"), "saved_p": ("--", "^")}
DEFAULT_STYLE = ("-", "x")


def case_key(case):
    return tuple(case[k] for k in SHAPE_KEYS)


def case_labels(keys):
    """Labels naming only the dimensions that vary within the suite ("B=2 S=512")."""
    varying = [i for i, name in enumerate(SHAPE_KEYS) if len({key[i] for key in keys}) > 1] or range(len(SHAPE_KEYS))
    return [" ".join(f"{SHAPE_KEYS[i]}={key[i]}" for i in varying) for key in keys]


def value(x):
    return math.nan if x is None else float(x)


def sol_pct(case):
    us, sol = case.get("us"), case.get("sol_us")
    if us is None or sol is None or us <= 0:
        return math.nan
    return 100.0 * sol / us


def series_label(run, several_dtypes):
    label = f"{run['impl']} {run['mode']}"
    if several_dtypes:
        label += f" {run['dtype']}"
    if all(c.get("us") is None for c in run["cases"]):
        label += " (no time)"
    return label


def plot_suite(report, suite, runs, out_path):
    keys = []
    for run in runs:
        for case in run["cases"]:
            if case_key(case) not in keys:
                keys.append(case_key(case))
    position = {key: i for i, key in enumerate(keys)}
    several_dtypes = len({run["dtype"] for run in runs}) > 1

    impls = list(dict.fromkeys(run["impl"] for run in runs))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = max(MIN_FIGURE_WIDTH, WIDTH_PER_CASE * len(keys)) + LEGEND_WIDTH
    fig, (ax_sol, ax_us) = plt.subplots(2, 1, figsize=(width, FIGURE_HEIGHT), sharex=True)
    for run in runs:
        xs = [position[case_key(c)] for c in run["cases"]]
        linestyle, marker = MODE_STYLES.get(run["mode"], DEFAULT_STYLE)
        style = dict(color=colors[impls.index(run["impl"]) % len(colors)], linestyle=linestyle, marker=marker,
                     label=series_label(run, several_dtypes))
        ax_sol.plot(xs, [sol_pct(c) for c in run["cases"]], **style)
        ax_us.plot(xs, [value(c.get("us")) for c in run["cases"]], **style)

    ax_sol.set_ylabel("% SOL")
    ax_sol.set_ylim(bottom=0)
    ax_sol.grid(True, alpha=0.3)
    ax_sol.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax_us.set_ylabel("latency (µs)")
    ax_us.set_yscale("log")
    ax_us.grid(True, which="both", alpha=0.3)
    ax_us.set_xticks(range(len(keys)))
    ax_us.set_xticklabels(case_labels(keys), rotation=45, ha="right")
    fig.suptitle(f"{suite} on {report.get('gpu', '?')} ({report.get('date', '?')})")
    fig.tight_layout()
    fig.savefig(out_path, dpi=DPI)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=Path, help="results file written by qksoftmax-bench / torch_peers.py")
    args = parser.parse_args(argv)
    try:
        report = json.loads(args.json.read_text())
    except (OSError, ValueError) as e:
        print(f"plot.py: cannot read {args.json}: {e}", file=sys.stderr)
        return 1

    suites = []
    for run in report.get("runs", []):
        if run["suite"] not in suites:
            suites.append(run["suite"])
    if not suites:
        print(f"plot.py: {args.json} has no runs", file=sys.stderr)
        return 1
    for suite in suites:
        out_path = args.json.with_name(f"{args.json.stem}-{suite}.png")
        plot_suite(report, suite, [r for r in report["runs"] if r["suite"] == suite], out_path)
        print(f"plot.py: wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

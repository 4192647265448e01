"""PNG plots: throughput against threads (workloads 2–4) and the message
journal's latency CDFs. Uses Debian's python3-matplotlib; without it the
plots are skipped with one line, the tables are still written."""

import math

from util import log

THREAD_WORKLOADS = ["metafsync", "varmail", "exim", "lsm"]
NINES = [0.5, 0.9, 0.99, 0.999, 0.9999, 0.99999]


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot

        return pyplot
    except ImportError:
        log("plots skipped: matplotlib missing (apt-get install -y python3-matplotlib)")
        return None


def throughput(aggregated, filesystems, path):
    pyplot = _pyplot()
    present = [name for name in THREAD_WORKLOADS if name in aggregated and aggregated[name]["cells"]]
    if pyplot is None or not present:
        return None
    columns = 2 if len(present) > 1 else 1
    rows = math.ceil(len(present) / columns)
    figure, axes = pyplot.subplots(rows, columns, figsize=(6 * columns, 4 * rows), squeeze=False)
    for index, name in enumerate(present):
        axis = axes[index // columns][index % columns]
        cells = aggregated[name]["cells"]
        for fs in filesystems:
            points = sorted(
                (cell["params"]["threads"], cell["median"]["ops_per_sec"])
                for (case, fs_name), cell in cells.items() if fs_name == fs.name
            )
            if points:
                axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=fs.name)
        axis.set_xscale("log", base=2)
        threads = sorted({cell["params"]["threads"] for cell in cells.values()})
        axis.set_xticks(threads)
        axis.set_xticklabels([str(t) for t in threads])
        axis.set_title(name)
        axis.set_xlabel("threads")
        axis.set_ylabel("ops/s (median)")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    for index in range(len(present), rows * columns):
        axes[index // columns][index % columns].axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    pyplot.close(figure)
    return path


def _median_run_cdf(cell):
    """The CDF of the run whose p99.99 is the median of the runs."""
    runs = sorted(cell["extras"], key=lambda pair: pair[0]["p99_99_us"])
    return runs[(len(runs) - 1) // 2][1]["cdf"]


def latency_cdf(aggregated, filesystems, path):
    pyplot = _pyplot()
    data = aggregated.get("msgjournal")
    if pyplot is None or not data or not data["cells"]:
        return None
    layouts = ["fresh", "fallocate", "zerofill"]
    rows_keys = sorted({(c["params"]["record_bytes"], c["params"]["reader"]) for c in data["cells"].values()})
    figure, axes = pyplot.subplots(
        len(rows_keys), len(layouts), figsize=(5 * len(layouts), 3.4 * len(rows_keys)), squeeze=False
    )
    for (case, fs_name), cell in data["cells"].items():
        params = cell["params"]
        row = rows_keys.index((params["record_bytes"], params["reader"]))
        axis = axes[row][layouts.index(params["layout"])]
        points = [(us, q) for q, us in _median_run_cdf(cell) if q < 1.0 and us > 0]
        style = "--" if fs_name.startswith("jext4") else "-"
        axis.plot([p[0] for p in points], [-math.log10(1 - p[1]) for p in points], style, label=fs_name)
        axis.set_title(case, fontsize=9)
    for row in axes:
        for axis in row:
            axis.set_xscale("log")
            axis.set_yticks([-math.log10(1 - q) for q in NINES])
            axis.set_yticklabels([f"{q * 100:g}%" for q in NINES], fontsize=7)
            axis.set_xlabel("append + fdatasync latency (µs)", fontsize=8)
            axis.grid(True, alpha=0.3)
            if axis.lines:
                axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    pyplot.close(figure)
    return path


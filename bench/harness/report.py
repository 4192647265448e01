"""Turns run records into medians, Markdown tables and the JSON file.

A record is one (round, filesystem, workload): its status ("ok", "failed",
"unavailable"), the per-case results, the fsck verdict and the FUSE server's
peak RSS. Figures shown are medians over the rounds that succeeded; ratios
divide a filesystem's median by the reference's median (kernel ext4, fuse2fs).
"""

import json

from util import NOT_CHECKED, median

REFERENCES = ("ext4", "fuse2fs")


def number(value):
    if value is None:
        return ""
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio(value, reference):
    if value is None or not reference:
        return ""
    return f"{value / reference:.2f}"


def aggregate(records, workloads, filesystems):
    """{workload: {"cases": [labels], "cells": {(case, fs): cell}, "notes": {fs: reason}}}
    where a cell holds the per-metric run values, medians and the params."""
    table = {}
    for workload in workloads:
        cases, cells, notes = [], {}, {}
        for record in records:
            if record["workload"] != workload.name:
                continue
            fs = record["fs"]
            if record["status"] != "ok":
                notes.setdefault(fs, f"{record['status']}: {record['error']}")
                continue
            for result in record["results"]:
                case = result["case"]
                if case not in cases:
                    cases.append(case)
                if not result["values"]:
                    extra = result["extra"]
                    reason = (
                        f"not supported: {extra['unsupported']}" if "unsupported" in extra
                        else f"failed: {extra.get('failed', 'no figures')}"
                    )
                    notes.setdefault((case, fs), reason)
                    continue
                cell = cells.setdefault((case, fs), {"runs": {}, "params": result["params"], "extras": []})
                for key, value in result["values"].items():
                    cell["runs"].setdefault(key, []).append(value)
                cell["extras"].append((result["values"], result["extra"]))
        for cell in cells.values():
            cell["median"] = {key: median(values) for key, values in cell["runs"].items()}
        table[workload.name] = {"cases": cases, "cells": cells, "notes": notes}
    return table


def workload_table(workload, aggregated, filesystems, runs):
    metrics = workload.metrics
    ratio_keys = workload.ratio_metrics or [metric.key for metric in metrics]
    labels = {metric.key: metric.label for metric in metrics}
    header = ["case", "filesystem"] + [metric.label for metric in metrics]
    references = getattr(workload, "references", REFERENCES)
    for key in ratio_keys:
        prefix = f"{labels[key]} " if len(ratio_keys) > 1 else ""
        header += [f"{prefix}÷ {reference}" for reference in references]
    header.append("spread")
    lines = [
        f"### {workload.name} — {workload.title}",
        "",
        f"Origin: {workload.origin}. "
        + ", ".join(f"{metric.label}: {metric.better} is better" for metric in metrics)
        + f". Median of up to {runs} run(s); ratio = this filesystem's median ÷ the reference's; "
        + "spread = (max − min) ÷ median over the runs, first metric.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    cases = aggregated["cases"] or ["(all)"]
    # A builder (imaging.py) has no mount: rows only where it runs.
    import imaging

    filesystems = [fs for fs in filesystems if imaging.applies(fs, workload)]
    for case in cases:
        for fs in filesystems:
            cell = aggregated["cells"].get((case, fs.name))
            if cell is None:
                notes = aggregated["notes"]
                reason = notes.get((case, fs.name)) or notes.get(fs.name, "no result")
                row = [case, fs.name, reason] + [""] * (len(header) - 3)
            else:
                row = [case, fs.name] + [number(cell["median"].get(metric.key)) for metric in metrics]
                for key in ratio_keys:
                    for reference in references:
                        ref = aggregated["cells"].get((case, reference))
                        row.append(ratio(cell["median"].get(key), ref and ref["median"].get(key)))
                first = cell["runs"][metrics[0].key]
                center = median(first)
                spread = (max(first) - min(first)) / center * 100 if center and len(first) > 1 else None
                row.append(f"±{spread / 2:.0f} %" if spread is not None else "")
            lines.append("| " + " | ".join(str(part) for part in row) + " |")
    return "\n".join(lines) + "\n"


def headline_case(workload, aggregated):
    """The one case of a workload shown in the headline table."""
    cases = aggregated["cases"]
    if not cases:
        return None
    if workload.plot == "threads":
        for case in cases:
            for (label, _fs), cell in aggregated["cells"].items():
                if label == case and cell["params"].get("threads") == 8:
                    return case
        return cases[-1]
    if workload.name == "msgjournal":
        return next((case for case in cases if case == "4 KiB, fallocate, writer"), cases[0])
    return cases[0]


def headline(workloads, aggregated, filesystems):
    """One row per filesystem, one column per workload's headline figure,
    with the ratio to kernel ext4 in parentheses."""
    columns = []
    for workload in workloads:
        data = aggregated[workload.name]
        case = headline_case(workload, data)
        if case is None:
            continue
        metric = next(
            (m for m in workload.metrics if m.key == "p99_99_us"), workload.metrics[0]
        )
        what = f"{metric.label} {metric.unit}" if len(workload.metrics) > 1 else metric.unit
        title = f"{workload.name}: {case}" + (f" ({what})" if what else "")
        columns.append((workload, data, case, metric, title))
    lines = [
        "| filesystem | " + " | ".join(title for *_, title in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for fs in filesystems:
        row = [fs.name]
        for workload, data, case, metric, _title in columns:
            cell = data["cells"].get((case, fs.name))
            if cell is None:
                notes = data["notes"]
                row.append((notes.get((case, fs.name)) or notes.get(fs.name, "—")).split(":")[0])
                continue
            value = cell["median"].get(metric.key)
            reference = data["cells"].get((case, "ext4"))
            part = number(value)
            if reference and fs.name != "ext4":
                part += f" ({ratio(value, reference['median'].get(metric.key))}×)"
            row.append(part)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def requests_table(workloads, aggregated, filesystems):
    """Requests the FUSE server answered per file made (untar, copy): the
    median over the runs, and the operations that made them (first run)."""
    lines = [
        "| workload | case | filesystem | files | requests per file | engine µs per file | transport µs per file "
        "| server threads' CPU µs per file | by operation, per file |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for workload in workloads:
        data = aggregated[workload.name]
        for case in data["cases"]:
            for fs in filesystems:
                cell = data["cells"].get((case, fs.name))
                extras = [extra for _, extra in cell["extras"] if "requests_per_file" in extra] if cell else []
                if not extras:
                    continue
                per_file = median([extra["requests_per_file"] for extra in extras])
                operations = ", ".join(
                    f"{name} {count}" for name, count in extras[0]["requests_by_operation_per_file"].items()
                )
                times = []
                for key in ("engine_us_per_file", "transport_us_per_file", "server_cpu_us_per_file"):
                    values = [extra[key] for extra in extras if key in extra]
                    times.append(number(median(values)) if values else "–")
                lines.append(
                    f"| {workload.name} | {case} | {fs.name} | {extras[0]['files']} | {number(per_file)} | "
                    f"{times[0]} | {times[1]} | {times[2]} | {operations} |"
                )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def integrity_table(records, filesystems, workloads):
    lines = [
        "| filesystem | workload | check after unmount (per run) | peak RSS: FUSE server or builder (MiB) | wall time per run (s) |",
        "|---|---|---|---|---|",
    ]
    import imaging

    for fs in filesystems:
        for workload in workloads:
            mine = [r for r in records if r["fs"] == fs.name and r["workload"] == workload.name]
            if not mine or not imaging.applies(fs, workload):
                continue
            verdicts = []
            for record in mine:
                if record["status"] == "unavailable":
                    verdicts.append("unavailable")
                elif record.get("fsck") is None:
                    verdicts.append(f"not checked ({record['status']})")
                elif record["fsck"] == "clean":
                    verdicts.append("clean")
                elif record["fsck"] == NOT_CHECKED:
                    verdicts.append(f"not checked ({NOT_CHECKED})")
                else:
                    verdicts.append(f"**{record['fsck']}**")
            distinct = list(dict.fromkeys(verdicts))
            summary = "all clean" if distinct == ["clean"] else "; ".join(distinct)
            rss = [r["peak_rss_kib"] for r in mine if r.get("peak_rss_kib")]
            walls = [r["wall_seconds"] for r in mine if r.get("wall_seconds") and r["status"] == "ok"]
            lines.append(
                f"| {fs.name} | {workload.name} | {summary} | "
                f"{number(max(rss) / 1024) if rss else ''} | {number(median(walls)) if walls else ''} |"
            )
    return "\n".join(lines) + "\n"


def machine_section(machine):
    rows = [f"- {key}: {value}" for key, value in machine.items() if not isinstance(value, dict)]
    versions = machine.get("versions", {})
    rows.append("- versions: " + ", ".join(f"{name} {version}" for name, version in versions.items()))
    return "\n".join(rows) + "\n"


def markdown(context, workloads, filesystems, records, aggregated):
    parts = [
        "# jext4 benchmark results",
        "",
        f"Run: {context['started']} · mode: {'quick' if context['quick'] else 'full'} · "
        f"runs: {context['runs']} · wall time: {context['duration_seconds']:.0f} s · "
        f"image: {context['image_gib']} GiB sparse file per filesystem and workload",
        "",
        "## Machine",
        "",
        machine_section(context["machine"]),
        "## Filesystems",
        "",
        "\n".join(f"- **{fs.name}**: {fs.description}" for fs in filesystems),
        "",
        "## Headline (median; in parentheses: ÷ kernel ext4)",
        "",
        headline(workloads, aggregated, filesystems),
    ]
    if context["failures"]:
        parts += ["## Failures", "", "\n".join(f"- {line}" for line in context["failures"]), ""]
    parts += ["## Workloads", ""]
    for workload in workloads:
        parts.append(workload_table(workload, aggregated[workload.name], filesystems, context["runs"]))
    requests = requests_table(workloads, aggregated, filesystems)
    if requests:
        parts += ["## FUSE requests per file (the servers' own counters: `jext4 stats`, floorfs's `user.floorfs.stats`)", "", requests]
    parts += ["## Integrity and memory", "", integrity_table(records, filesystems, workloads)]
    return "\n".join(parts)


def _significant(value):
    """Latencies come from HdrHistogram at 3 significant digits: keep 4, drop the noise digits."""
    if not isinstance(value, float) or value == 0:
        return value
    return float(f"{value:.4g}")


def _compact(records):
    """Rounds the CDF points, the bulk of the file."""
    for record in records:
        for result in record.get("results", []):
            cdf = result.get("extra", {}).get("cdf")
            if cdf:
                result["extra"]["cdf"] = [[q, _significant(us)] for q, us in cdf]
    return records


def json_document(context, workloads, records, aggregated):
    medians = {}
    for workload in workloads:
        data = aggregated[workload.name]
        medians[workload.name] = {
            case: {
                fs: data["cells"][(c, fs)]["median"]
                for (c, fs) in data["cells"] if c == case
            }
            for case in data["cases"]
        }
        medians[workload.name]["_notes"] = {
            " / ".join(key) if isinstance(key, tuple) else key: note for key, note in data["notes"].items()
        }
    document = {
        **context,
        "workloads": {
            w.name: {"title": w.title, "origin": w.origin, "metrics": [vars(m) for m in w.metrics]}
            for w in workloads
        },
        "medians": medians,
        "records": "@records@",
    }
    # Indented for reading, except the records: one line each, or the CDF
    # points alone would take a hundred thousand lines.
    lines = ",\n".join(
        "  " + json.dumps(record, ensure_ascii=False, separators=(",", ":")) for record in _compact(records)
    )
    text = json.dumps(document, indent=1, ensure_ascii=False)
    return text.replace('"@records@"', "[\n" + lines + "\n ]") + "\n"

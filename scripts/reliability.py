#!/usr/bin/env python3
"""The counts of scripts/gpu-check.sh's reliability stages, as one JSON file.

    reliability.py sanitize DIR TOOLS SHARDS SUITE_TESTS SECONDS OUT
        every sanitizer's shards of the GPU test suite (DIR/sanitize-all-<tool>-<shard>.{log,json,rc}) -> OUT
    reliability.py stress COUNTS STATUS SECONDS THREADS OUT
        the stress run's phase counts (QKSOFTMAX_STRESS_JSON) and its exit status -> OUT
    reliability.py merge DIR ENV OUT
        DIR/sanitize.json, DIR/stress.json and DIR/fuzz-*.json with the machine (ENV, gpu-check's env.txt) -> OUT

A shard counts its tests from GoogleTest's JSON report and its errors from compute-sanitizer's summary line; a
shard without either (killed, timed out, crashed) is counted as incomplete, never as clean.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

SUMMARY = re.compile(r"========= ERROR SUMMARY: (\d+) errors?")
RACE_SUMMARY = re.compile(r"========= RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
TIMEOUT_STATUS = 124


def gtest_counts(report: Path) -> dict[str, int] | None:
    """Tests run, failed and skipped in a GoogleTest JSON report; None if there is none."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return None
    counts = {"run": 0, "failed": 0, "skipped": 0}
    for suite in data.get("testsuites", []):
        for test in suite.get("testsuite", []):
            if test.get("result") == "SKIPPED":
                counts["skipped"] += 1
            elif test.get("status") == "RUN":
                counts["run"] += 1
                counts["failed"] += bool(test.get("failures"))
    return counts


def sanitize(directory: Path, tools: list[str], shards: int, suite_tests: int, seconds: int, out: Path) -> None:
    result = {"suite_tests": suite_tests, "shards_per_tool": shards, "seconds": seconds, "tools": {}}
    for tool in tools:
        entry = {"tests_run": 0, "tests_failed": 0, "tests_skipped": 0, "errors": 0, "incomplete_shards": 0,
                 "timed_out_shards": 0}
        if tool == "racecheck":
            entry["hazard_warnings"] = 0
        for shard in range(shards):
            stem = directory / f"sanitize-all-{tool}-{shard}"
            log = stem.with_suffix(".log").read_text(errors="replace") if stem.with_suffix(".log").exists() else ""
            rc_file = stem.with_suffix(".rc")
            status = int(rc_file.read_text().strip()) if rc_file.exists() else None
            counts = gtest_counts(stem.with_suffix(".json"))
            summary = RACE_SUMMARY.findall(log) if tool == "racecheck" else SUMMARY.findall(log)
            if counts is None or not summary:
                entry["incomplete_shards"] += 1
            entry["timed_out_shards"] += status == TIMEOUT_STATUS
            if counts:
                entry["tests_run"] += counts["run"]
                entry["tests_failed"] += counts["failed"]
                entry["tests_skipped"] += counts["skipped"]
            if summary and tool == "racecheck":
                entry["errors"] += int(summary[-1][1])
                entry["hazard_warnings"] += int(summary[-1][2])
            elif summary:
                entry["errors"] += int(summary[-1])
        entry["clean"] = (entry["errors"] == 0 and entry["tests_failed"] == 0 and entry["incomplete_shards"] == 0
                          and entry["tests_run"] + entry["tests_skipped"] == suite_tests)
        result["tools"][tool] = entry
    out.write_text(json.dumps(result, indent=2) + "\n")
    for tool, entry in result["tools"].items():
        print(f"{tool}: {'clean' if entry['clean'] else 'NOT CLEAN'}: {entry['tests_run']}/{suite_tests} tests run, "
              f"{entry['tests_failed']} failed, {entry['errors']} errors, {entry['incomplete_shards']} shards "
              f"incomplete")


def measured(path: Path) -> dict:
    """A stage's counts with the time they were written (stages may come from earlier calls on the machine)."""
    when = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"measured_at": when, **json.loads(path.read_text())}


def merge(directory: Path, env: Path, out: Path) -> None:
    result: dict = {"machine": env.read_text().strip().splitlines() if env.exists() else []}
    for name in ("sanitize", "stress"):
        path = directory / f"{name}.json"
        if path.exists():
            result[name] = measured(path)
    fuzz = {p.stem.removeprefix("fuzz-"): measured(p) for p in sorted(directory.glob("fuzz-*.json"))}
    if fuzz:
        result["fuzz"] = fuzz
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


def stress(counts: Path, status: int, seconds: float, threads: int, out: Path) -> None:
    """The stress run's phases (QKSOFTMAX_STRESS_JSON) with its exit status: no counts file means a crash."""
    phases = json.loads(counts.read_text()) if counts.exists() else {}
    totals = {key: sum(p[key] for p in phases.values()) for key in ("calls", "checked", "mismatches", "errors")}
    crashed = not phases or status not in (0, 1)
    result = {"seconds": seconds, "threads": threads, "exit_status": status, "crashes": int(crashed), **totals,
              "phases": phases}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"stress: {totals['calls']} calls, {totals['checked']} checked, {totals['mismatches']} mismatches, "
          f"{totals['errors']} errors, {int(crashed)} crashes (exit status {status})")


def main(argv: list[str]) -> int:
    if len(argv) == 7 and argv[0] == "sanitize":
        sanitize(Path(argv[1]), argv[2].split(), int(argv[3]), int(argv[4]), int(argv[5]), Path(argv[6]))
    elif len(argv) == 6 and argv[0] == "stress":
        stress(Path(argv[1]), int(argv[2]), float(argv[3]), int(argv[4]), Path(argv[5]))
    elif len(argv) == 4 and argv[0] == "merge":
        merge(Path(argv[1]), Path(argv[2]), Path(argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

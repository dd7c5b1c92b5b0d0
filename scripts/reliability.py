#!/usr/bin/env python3
"""The counts of scripts/gpu-check.sh's reliability stages, as one JSON file.

    reliability.py sanitize DIR "TOOL=TESTS ..." "TOOL=SHARDS ..." SECONDS OUT
        every sanitizer's shards of the GPU test suite (DIR/sanitize-all-<tool>-<shard>.{log,json,rc}), each
        tool over its TESTS tests -> OUT
    reliability.py stress COUNTS STATUS SECONDS THREADS OUT
        the stress run's phase counts (QKSOFTMAX_STRESS_JSON) and its exit status -> OUT
    reliability.py fuzz DEVICE STATUS JSON
        the fuzzer's exit status added to its JSON report, or a report of the crash where it wrote none
    reliability.py merge DIR ENV OUT
        DIR/sanitize.json, DIR/stress.json and DIR/fuzz-*.json with the machine (ENV, gpu-check's env.txt) -> OUT

A shard counts its tests from GoogleTest's JSON report and its errors from compute-sanitizer's summary line; a
shard without either (stopped at its time limit, crashed) is counted as incomplete, never as clean, with the
tests its log shows finished and the error reports printed before it stopped.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

SUMMARY = re.compile(r"========= ERROR SUMMARY: (\d+) errors?")
RACE_SUMMARY = re.compile(r"========= RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
# A test's end in GoogleTest's log ("[       OK ] Suite.Test (12 ms)"), and a report of compute-sanitizer's
# that is not its banner or a summary (each error's report starts "========= " then its description).
TEST_END = re.compile(r"^\[ {7}OK \]|^\[  FAILED  \] \S+\.\S+|^\[  SKIPPED \]", re.M)
TEST_FAILED = re.compile(r"^\[  FAILED  \] \S+\.\S+ \(\d+ ms\)", re.M)
TEST_TIME = re.compile(r"^\[ {7}OK \] (\S+) \((\d+) ms\)", re.M)
SANITIZER_REPORT = re.compile(r"^========= (?!COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|\s)\S",
                              re.M)
# An error a CUDA API call returned, which compute-sanitizer counts among its errors: the error-path tests provoke
# some on purpose (a TMA descriptor that fails to encode, an allocation past the device's memory).
API_REPORT = re.compile(r"^========= Program hit (\S+) .*? on CUDA API call to (\S+?)\.?$", re.M)
TIMEOUT_STATUS = 124
TIMEOUT_KILLED = 137  # timeout -k: the process ignored the first signal
SLOWEST = 5  # tests listed per tool with their time


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


def sanitize(directory: Path, suite: dict[str, int], shards_of: dict[str, int], seconds: int, out: Path) -> None:
    result = {"shards_per_tool": shards_of, "seconds": seconds, "tools": {}}
    for tool, suite_tests in suite.items():
        entry = {"suite_tests": suite_tests, "tests_run": 0, "tests_failed": 0, "tests_skipped": 0, "errors": 0,
                 "api_errors": 0, "api_error_calls": {}, "incomplete_shards": 0, "timed_out_shards": 0}
        if tool == "racecheck":
            entry["hazard_warnings"] = 0
        times: list[tuple[int, str]] = []
        for shard in range(shards_of[tool]):
            stem = directory / f"sanitize-all-{tool}-{shard}"
            log = stem.with_suffix(".log").read_text(errors="replace") if stem.with_suffix(".log").exists() else ""
            rc_file = stem.with_suffix(".rc")
            status = int(rc_file.read_text().strip()) if rc_file.exists() else None
            counts = gtest_counts(stem.with_suffix(".json"))
            summary = RACE_SUMMARY.findall(log) if tool == "racecheck" else SUMMARY.findall(log)
            times += [(int(ms), name) for name, ms in TEST_TIME.findall(log)]
            for error, call in API_REPORT.findall(log):
                entry["api_errors"] += 1
                key = f"{error} on {call}"
                entry["api_error_calls"][key] = entry["api_error_calls"].get(key, 0) + 1
            if counts is None or not summary:
                entry["incomplete_shards"] += 1
            entry["timed_out_shards"] += status in (TIMEOUT_STATUS, TIMEOUT_KILLED)
            if counts:
                entry["tests_run"] += counts["run"]
                entry["tests_failed"] += counts["failed"]
                entry["tests_skipped"] += counts["skipped"]
            else:  # what the log shows finished before the shard stopped
                entry["tests_run"] += len(TEST_END.findall(log))
                entry["tests_failed"] += len(TEST_FAILED.findall(log))
            if summary and tool == "racecheck":
                entry["errors"] += int(summary[-1][1])
                entry["hazard_warnings"] += int(summary[-1][2])
            elif summary:
                entry["errors"] += int(summary[-1])
            else:  # at least the reports printed before it stopped
                entry["errors"] += len(SANITIZER_REPORT.findall(log))
        # Errors other than API calls' returned errors (memory, race, synchronisation, initialisation).
        entry["sanitizer_errors"] = entry["errors"] - entry["api_errors"]
        entry["clean"] = (entry["sanitizer_errors"] == 0 and entry["tests_failed"] == 0
                          and entry["incomplete_shards"] == 0
                          and entry["tests_run"] + entry["tests_skipped"] == suite_tests)
        entry["slowest_tests_ms"] = {name: ms for ms, name in sorted(times, reverse=True)[:SLOWEST]}
        result["tools"][tool] = entry
    out.write_text(json.dumps(result, indent=2) + "\n")
    for tool, entry in result["tools"].items():
        print(f"{tool}: {'clean' if entry['clean'] else 'NOT CLEAN'}: {entry['tests_run']}/{entry['suite_tests']} "
              f"tests run, {entry['tests_failed']} failed, {entry['sanitizer_errors']} errors "
              f"(+{entry['api_errors']} API errors returned), {entry['incomplete_shards']} "
              f"shards incomplete ({entry['timed_out_shards']} stopped at the time limit)")


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
    timed_out = status in (TIMEOUT_STATUS, TIMEOUT_KILLED)
    crashed = not timed_out and (not phases or status not in (0, 1))
    result = {"seconds": seconds, "threads": threads, "exit_status": status, "crashes": int(crashed),
              "timed_out": int(timed_out), **totals, "phases": phases}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"stress: {totals['calls']} calls, {totals['checked']} checked, {totals['mismatches']} mismatches, "
          f"{totals['errors']} errors, {int(crashed)} crashes, {int(timed_out)} timed out (exit status {status})")


def fuzz(device: str, status: int, report: Path) -> None:
    """The fuzzer's exit status in its report (0: every outcome as expected, 1: unexpected outcomes, 2: it
    could not run); where it wrote none it crashed or hung, and the report says so."""
    timed_out = status in (TIMEOUT_STATUS, TIMEOUT_KILLED)
    could_not_run = 2
    data = json.loads(report.read_text()) if report.exists() else {
        "device": device, "crashed": int(not timed_out and status != could_not_run)}
    data["exit_status"] = status
    data["timed_out"] = int(timed_out)
    report.write_text(json.dumps(data) + "\n")
    if "crashed" in data:
        print(f"qksoftmax_fuzz --device {device}: no report (exit status {status}"
              f"{', stopped at its time limit' if timed_out else ''})")


def tool_counts(text: str) -> dict[str, int] | None:
    """"memcheck=4 racecheck=12" -> {"memcheck": 4, "racecheck": 12}; None where a pair is not TOOL=N."""
    try:
        return {tool: int(count) for tool, count in (pair.split("=") for pair in text.split())}
    except ValueError:
        return None


def main(argv: list[str]) -> int:
    if len(argv) == 6 and argv[0] == "sanitize":
        suite, shards = tool_counts(argv[2]), tool_counts(argv[3])
        if suite is None or shards is None or set(suite) - set(shards):
            print(f"reliability.py sanitize: want \"TOOL=N ...\" for the tests and the shards of every tool, got "
                  f"{argv[2]!r} and {argv[3]!r}", file=sys.stderr)
            return 2
        sanitize(Path(argv[1]), suite, shards, int(argv[4]), Path(argv[5]))
    elif len(argv) == 6 and argv[0] == "stress":
        stress(Path(argv[1]), int(argv[2]), float(argv[3]), int(argv[4]), Path(argv[5]))
    elif len(argv) == 4 and argv[0] == "fuzz":
        fuzz(argv[1], int(argv[2]), Path(argv[3]))
    elif len(argv) == 4 and argv[0] == "merge":
        merge(Path(argv[1]), Path(argv[2]), Path(argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

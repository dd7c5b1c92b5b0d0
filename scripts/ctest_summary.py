#!/usr/bin/env python3
"""Counts of a CTest JUnit file, with each skip's reason: CTest's own summary counts a skipped test as passed.

    python3 scripts/ctest_summary.py build/ctest-junit.xml

Prints 'ctest: N passed, N failed, N skipped' and, per reason, how many tests were skipped for it (the
message GoogleTest prints after "Skipped", or CTest's own reason).
"""

import collections
import re
import sys
import xml.etree.ElementTree as ET

# GoogleTest: "<file>:<line>: Skipped" then the message given to GTEST_SKIP() on the next line.
GTEST_SKIP_REASON = re.compile(r":\d+: Skipped\n(.*)")


def main(path: str) -> int:
    passed = failed = 0
    reasons: collections.Counter[str] = collections.Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is not None:
            output = case.findtext("system-out") or ""
            match = GTEST_SKIP_REASON.search(output)
            reasons[match.group(1).strip() if match else skipped.get("message", "no reason given")] += 1
        elif case.find("failure") is not None or case.get("status") == "fail":
            failed += 1
        else:
            passed += 1
    print(f"ctest: {passed} passed, {failed} failed, {sum(reasons.values())} skipped")
    for reason, count in reasons.most_common():
        print(f"  skipped {count}: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

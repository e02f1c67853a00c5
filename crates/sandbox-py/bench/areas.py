"""Per-area passed / skipped / failed counts of a pytest JUnit XML report of the
conformance run, one column per test class, as the Markdown table docs/python.md shows.
Areas are the suite's own section comments (``# --- lifecycle ---`` …) in
``sandboxio/testing/suite.py``.

    python areas.py report.xml
"""

from __future__ import annotations

import inspect
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

import sandboxio.testing.suite as suite


def areas() -> dict[str, str]:
    """Test name -> area, from the suite's section comments."""
    out: dict[str, str] = {}
    area = "other"
    for line in inspect.getsource(suite).splitlines():
        if m := re.match(r"\s*# --- ([a-z_ ,]+?) -+\s*$", line):
            area = m.group(1)
        elif m := re.match(r"\s*async def (test_\w+)", line):
            out[m.group(1)] = area
    return out


def main() -> None:
    by_test = areas()
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    classes: list[str] = []
    for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
        # Only the suite's own tests: the wheel's extra tests (native lifecycle, the warm
        # pool) are not sandboxio's and have no area.
        if case.get("name", "") not in by_test:
            continue
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        if cls not in classes:
            classes.append(cls)
        area = by_test[case.get("name", "")]
        slot = 0
        if case.find("skipped") is not None:
            slot = 1
        elif case.find("failure") is not None or case.find("error") is not None:
            slot = 2
        counts[area][cls][slot] += 1
    order = list(dict.fromkeys(by_test.values()))
    print("| area | " + " | ".join(classes) + " |")
    print("| --- | " + " | ".join("---" for _ in classes) + " |")
    totals = {c: [0, 0, 0] for c in classes}
    for area in order:
        if area not in counts:
            continue
        cells = []
        for c in classes:
            p, s, f = counts[area][c]
            totals[c] = [a + b for a, b in zip(totals[c], (p, s, f))]
            cells.append(f"{p} / {s} / {f}")
        print(f"| {area} | " + " | ".join(cells) + " |")
    print("| **total** | " + " | ".join("**{} / {} / {}**".format(*totals[c]) for c in classes) + " |")


if __name__ == "__main__":
    main()

"""The GPU check's summary (benchmarks/gpu/run.sh): each part's exit status and time, every cuda test's outcome (with
the reason of each skip and the first line of each failure), and the benchmark's numbers and issue 38's goals.

    python benchmarks/gpu/summary.py OUT_DIR env:0:8.2 tests:0:141.0 bench:0:230.5

Standard library only: it runs even where torch cannot be imported.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from xml.etree import ElementTree

TESTS_LOG, TESTS_XML, BENCH_JSON = "2-tests.log", "2-tests.xml", "3-bench.json"


def test_outcomes(path: Path) -> tuple[dict[str, int], list[str]]:
    """Counts per outcome and one line per test (skips grouped under their reason), from pytest's JUnit XML."""
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    lines, skips = [], {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        if case.get("name") is None:  # the test an interrupt stopped: pytest records an empty case
            continue
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                why = ((child.get("message") or child.text or "").strip().splitlines() or [""])[0][:300]
                break
        counts[outcome] += 1
        if outcome == "skipped":
            skips.setdefault(why, []).append(name)
        else:
            lines.append(f"  {outcome.upper():7} {name} ({case.get('time', '?')} s)" + (f": {why}" if why else ""))
    for why, names in skips.items():
        lines.append(f"  SKIPPED {len(names)}, because {why}:")
        lines += [f"    {name}" for name in names]
    return counts, lines


def bench_lines(out: Path) -> list[str]:
    path = out / BENCH_JSON
    if not path.exists():
        return ["  no benchmark results (see 3-bench.log)"]
    result = json.loads(path.read_text())
    if "skipped" in result:
        return [f"  skipped: {result['skipped']}"]
    lines = []
    info = result.get("machine", {})
    lines.append(f"  {info.get('gpu', info.get('device'))}, torch {info.get('torch')}, CUDA {info.get('cuda')}, "
                 f"accelerate {info.get('accelerate')}; bf16 matmul peak {result.get('bf16_peak_tflops')} TFLOP/s")
    for name, model in result.get("models", {}).items():
        if "error" in model:
            lines.append(f"  {name}: failed: {model['error']}")
            continue
        lines.append(f"  {name} (batch of {model['batch_items']} {model['unit']}), {model.get('seconds')} s:")
        for label, row in model["variants"].items():
            if "median_ms" in row:
                lines.append(f"    {label:24} {row['median_ms']:9.2f} ms/step {row['per_s']:11.1f} {model['unit']}/s  "
                             f"MFU {100 * row.get('mfu', 0):5.1f}%  rounds {row['rounds']}, first steps "
                             f"{row['first_steps_s']} s")
            else:
                lines.append(f"    {label:24} {row.get('error', 'not measured')}")
            if "plan" in row:
                lines.append(f"      auto chose {row['plan']}: settled {row['settled']} at step "
                             f"{row['settled_at_step']} after {row['search_s']} s; {row['why']}")
        for name_, ratio in model.get("ratios", {}).items():
            lines.append(f"    {name_}: {ratio['median']}x (rounds {ratio['min']}-{ratio['max']}, {ratio['rounds']})")
        for goal, verdict in model.get("goals", {}).items():
            state = {True: "met", False: f"NOT met (short by {verdict['short_by']})"}.get(verdict["met"],
                                                                                         "not measured")
            lines.append(f"    goal {goal} >= {verdict['wanted']}: {verdict['measured']} -> {state}")
    return lines


def main(out: Path, parts: list[str]) -> str:
    lines = ["accel GPU check (benchmarks/gpu/run.sh): summary", "parts (exit status, seconds):"]
    failed = []
    for part in parts:
        name, status, seconds = part.split(":")
        skipped = name == "bench" and status == "0" and "skipped" in json.loads(
            (out / BENCH_JSON).read_text() if (out / BENCH_JSON).exists() else "{}")
        word = "skipped" if skipped else "not run" if status == "-" else "ok" if status == "0" else (
            "TIMED OUT" if status in ("124", "137") else "FAILED")
        if word in ("FAILED", "TIMED OUT"):
            failed.append(name)
        lines.append(f"  {name:6} {word:9} exit {status:>4}  {seconds:>7} s")
    xml, log = out / TESTS_XML, out / TESTS_LOG
    found = re.search(r"collected (\d+) items?(?: / (\d+) deselected)?", log.read_text(errors="replace")) \
        if log.exists() else None
    selected = int(found.group(1)) - int(found.group(2) or 0) if found else 0
    if xml.exists():
        counts, tests = test_outcomes(xml)
        lines.append("cuda tests: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
        if selected > sum(counts.values()):
            lines.append(f"  NOT RUN: {selected - sum(counts.values())} of the {selected} selected (stopped at the "
                         "time limit: 2-tests.log says where)")
        lines += tests
    else:
        lines.append("cuda tests: no results (see 2-tests.log)")
    lines.append("benchmark:")
    lines += bench_lines(out)
    lines.append("result: " + (f"FAILED ({', '.join(failed)})" if failed else "ok"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    text = main(folder, sys.argv[2:])
    (folder / "0-summary.txt").write_text(text)
    print(text, end="")

"""Strict check of an Autobahn index.json against the expected-failures file.

A case passes only if both `behavior` and `behaviorClose` are OK or
INFORMATIONAL. NON-STRICT, FAILED, UNIMPLEMENTED, WRONG CODE, UNCLEAN and
anything else fail, unless the case matches a pattern in the expected-failures
file. Excused cases that pass anyway are reported, so the file can shrink.
Prints `N passed, N failed` as its last line and exits non-zero on failures.

One failure is the machine's, not the server's: kosoku gives many cases half
a second in all (its "kill after" timer), and on a loaded machine (or behind
the TLS bridge, whose forked process carries every byte) that half second
can pass before the server's side of the end arrives: after a clean closing
handshake (the server's code echoed, 1000 or the case's failure code, 1007
for invalid UTF-8), before the TCP close, or before the server's close frame
itself. kosoku then drops the connection and scores the close "FAILED BY
CLIENT" or "UNCLEAN". `--stalled` lists the cases its kill timer ended
(`KLE` in the wire log) whose behaviour was right, and run.sh runs them
again, alone; `--rerun INDEX` then scores each by its rerun, strictly, and
says so. A server that is wrong is wrong again alone. Every other failure
stands.
"""

import argparse
import fnmatch
import json
import os
import sys

GOOD = {"OK", "INFORMATIONAL"}


def case_key(case_id):
    return tuple(int(part) for part in case_id.split("."))


def load_expected(path):
    """Lines `PATTERN  reason...`; `#` starts a comment. A reason is required."""
    expected = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            pattern, _, reason = line.partition(" ")
            if not reason.strip():
                sys.exit(f"{path}:{number}: '{pattern}' has no reason")
            expected.append((pattern, reason.strip()))
    return expected


def load_cases(path):
    with open(path, encoding="utf-8") as f:
        index = json.load(f)
    cases = {}
    for agent_cases in index.values():
        cases.update(agent_cases)
    return cases


def stalled(result, reports):
    """The case failed only because kosoku's kill timer ended it, its
    behaviour right (see the module's doc)."""
    if result.get("behavior") not in GOOD:
        return False
    if result.get("behaviorClose") not in ("FAILED BY CLIENT", "UNCLEAN"):
        return False
    try:
        with open(os.path.join(reports, result["reportfile"]), encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError, KeyError):
        return False
    killed = any(entry == ["KLE"] for entry in report.get("wirelog", []))
    return killed and report.get("droppedByMe") is True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--index", required=True)
    parser.add_argument("--expected", required=True)
    parser.add_argument("--cases", type=int, help="how many cases must have run")
    parser.add_argument("--stalled", action="store_true", help="list the cases to run again")
    parser.add_argument("--rerun", help="the index of those cases' second run")
    args = parser.parse_args()

    try:
        cases = load_cases(args.index)
    except (OSError, ValueError) as e:
        print(f"autobahn[{args.backend}]: no usable report ({e})")
        print("0 passed, 1 failed")
        return 1
    reports = os.path.dirname(args.index)
    if args.stalled:
        for case_id in sorted(cases, key=case_key):
            if stalled(cases[case_id], reports):
                print(case_id)
        return 0
    if args.rerun:
        try:
            again = load_cases(args.rerun)
        except (OSError, ValueError) as e:
            print(f"autobahn[{args.backend}]: the rerun left no usable report ({e})")
            again = {}
        for case_id in sorted(again, key=case_key):
            if case_id in cases and stalled(cases[case_id], reports):
                first = cases[case_id]
                print(
                    f"autobahn[{args.backend}]: {case_id} was ended by kosoku's kill timer "
                    f"({first.get('behaviorClose')}, {first.get('duration')} ms); "
                    f"run again alone: {again[case_id].get('behavior')}/"
                    f"{again[case_id].get('behaviorClose')} ({again[case_id].get('duration')} ms)"
                )
                cases[case_id] = again[case_id]
    expected = load_expected(args.expected)

    passed, failed, excused, excused_but_ok = [], [], [], []
    for case_id in sorted(cases, key=case_key):
        result = cases[case_id]
        ok = result.get("behavior") in GOOD and result.get("behaviorClose") in GOOD
        excuse = next((r for p, r in expected if fnmatch.fnmatchcase(case_id, p)), None)
        if ok:
            (excused_but_ok if excuse else passed).append(case_id)
        elif excuse:
            excused.append(case_id)
        else:
            failed.append((case_id, result))

    for case_id, result in failed:
        print(
            f"autobahn[{args.backend}]: FAIL {case_id}: behavior={result.get('behavior')} "
            f"behaviorClose={result.get('behaviorClose')} "
            f"remoteCloseCode={result.get('remoteCloseCode')}"
        )
    if excused:
        reasons = sorted({r for p, r in expected})
        print(
            f"autobahn[{args.backend}]: {len(excused)} cases excused by "
            f"expected-failures.txt ({'; '.join(reasons)})"
        )
    for case_id in excused_but_ok:
        print(f"autobahn[{args.backend}]: note: excused case {case_id} now passes")
    total = len(cases)
    print(f"autobahn[{args.backend}]: {total} cases run")
    if args.cases is not None and total != args.cases:
        print(f"autobahn[{args.backend}]: expected {args.cases} cases, {total} ran")
        failed.append(("count", {}))
    # Excused cases that pass count as passed.
    print(f"{len(passed) + len(excused_but_ok)} passed, {len(failed)} failed")
    return 1 if failed or total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

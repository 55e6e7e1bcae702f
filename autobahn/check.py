"""Strict check of an Autobahn index.json against the expected-failures file.

A case passes only if both `behavior` and `behaviorClose` are OK or
INFORMATIONAL. NON-STRICT, FAILED, UNIMPLEMENTED, WRONG CODE, UNCLEAN and
anything else fail, unless the case matches a pattern in the expected-failures
file. Excused cases that pass anyway are reported, so the file can shrink.
Prints `N passed, N failed` as its last line and exits non-zero on failures.
"""

import argparse
import fnmatch
import json
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--index", required=True)
    parser.add_argument("--expected", required=True)
    parser.add_argument("--cases", type=int, help="how many cases must have run")
    args = parser.parse_args()

    try:
        with open(args.index, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        print(f"autobahn[{args.backend}]: no usable report ({e})")
        print("0 passed, 1 failed")
        return 1
    cases = {}
    for agent_cases in index.values():
        cases.update(agent_cases)
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

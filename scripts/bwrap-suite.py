#!/usr/bin/env python3
"""The two halves of scripts/bwrap-suite.sh that are easier in Python.

split TEST.sh: rewrite one of bubblewrap's shell tests so that a failing
test does not end the file (the test comes from bubblewrap's source, which
str never stores).

bubblewrap's tests (tests/test-run.sh ...) are one `set -e` script each
that prints TAP "ok" lines: the first failure ends the file, and every test
after it is not run. For a side-by-side count that is too coarse, so this
reads the script's top-level statements and writes an equivalent script
where each group of statements ending in an "ok" line runs in its own
`set -e` subshell (the top-level `for` loops one group per iteration and
per "ok" of their body), and a group that fails prints
"not ok - <the name of its first test not passed>". Everything before the
TAP plan line (`echo "1..N"`, the library setup) runs as it is.

Both sides run the same rewritten file. FUSE_DIR is emptied after the
library's setup: the FUSE tests are skipped for both.

unittest2tap: read a Python unittest run's verbose output (test-seccomp.py
-v) on stdin and print one TAP line per test.

report NAME=DIR NAME=DIR: each DIR holds one TAP output per test file
(FILE.tap); print pass, fail and skip counts side by side, and every test
whose outcome differs between the sides.

usage: bwrap-suite.py split TEST.sh > GENERATED.sh
       bwrap-suite.py unittest2tap < OUTPUT > TAP
       bwrap-suite.py report bwrap=DIR str=DIR
"""
import os
import re
import sys

OK_ECHO = re.compile(r'^(\s*)echo\s+((["\']?)ok\b.*)$')
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
OPEN = re.compile(r"^(if|for|while|until|case)\b")
CLOSE = re.compile(r"^(fi|done|esac)\b")
CLOSES_SAME_LINE = re.compile(r"(;|\s)(fi|done|esac)\s*(;|$)")


def statements(lines):
    """Split lines into top-level statements (lists of lines)."""
    out, cur, depth, heredoc = [], [], 0, None
    for line in lines:
        cur.append(line)
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            else:
                continue
        else:
            s = line.strip()
            if not s.startswith("#"):
                if OPEN.match(s) and not CLOSES_SAME_LINE.search(s):
                    depth += 1
                elif CLOSE.match(s):
                    depth -= 1
                m = HEREDOC.search(s)
                if m and not s.startswith("#"):
                    heredoc = m.group(1)
                    continue
        s = line.rstrip()
        if depth == 0 and heredoc is None and not s.endswith(("\\", "&&", "||", "|")):
            if any(l.strip() and not l.strip().startswith("#") for l in cur):
                out.append(cur)
                cur = []
    if cur:
        out.append(cur)
    return out


def slots(stmt):
    """The tests of a statement, in order: each slot lists the alternative
    "ok" lines (an if's branches print one or the other)."""
    result, cursor, frames = [], 0, []
    for line in stmt:
        s = line.strip()
        if s.startswith("#"):
            continue
        if OPEN.match(s) and not CLOSES_SAME_LINE.search(s):
            frames.append([cursor, cursor])  # branch start, furthest end
        elif re.match(r"^(else|elif)\b", s) and frames:
            f = frames[-1]
            f[1] = max(f[1], cursor)
            cursor = f[0]
        elif CLOSE.match(s) and frames:
            f = frames.pop()
            cursor = max(f[1], cursor)
        m = OK_ECHO.match(line)
        if m:
            while len(result) <= cursor:
                result.append([])
            result[cursor].append(m.group(2))
            cursor += 1
    return result


def has_ok(stmt):
    return any(OK_ECHO.match(l) for l in stmt)


def body(stmt):
    """Rewrite the "ok" lines to count themselves."""
    return [OK_ECHO.sub(r"\1__ok \2", l) for l in stmt]


def emit_group(out, stmts):
    names = [s for st in stmts for s in slots(st)]
    out.append("( set -e; trap __reap EXIT\n")
    for st in stmts:
        out.extend(body(st))
    out.append(")\n")
    args = " ".join('"$(echo %s)"' % " '|' ".join(alts) for alts in names)
    out.append("__check $? %s\n" % args)


def split(path):
    lines = open(path).read().splitlines(keepends=True)
    lines = [l if l.endswith("\n") else l + "\n" for l in lines]
    plan = next(i for i, l in enumerate(lines) if re.match(r'^echo\s+["\']?1\.\.\d+', l))
    out = lines[: plan + 1]
    out.append(
        "# --- rewritten by str's scripts/bwrap-suite-split.py: one subshell per test ---\n"
        "FUSE_DIR=  # the FUSE tests are skipped for both sides\n"
        "__ok() { echo \"$@\"; echo >> \"$STR_SUITE_OKFILE\"; }\n"
        "__reap() { local j; j=$(jobs -p); [ -z \"$j\" ] || kill $j 2>/dev/null || true; }\n"
        "__name() { local t=${1#ok}; t=${t# }; echo \"${t#- }\" | sed -e 's/ | ok -* */ | /g'; }\n"
        "__check() {\n"
        "  local rc=$1 n; shift; n=$(wc -l < \"$STR_SUITE_OKFILE\"); : > \"$STR_SUITE_OKFILE\"\n"
        "  [ \"$rc\" = 0 ] && return 0\n"
        "  if [ \"$n\" -ge $# ]; then echo \"not ok - the commands after: ${@: -1} (status $rc)\"; return 0; fi\n"
        "  shift \"$n\"; echo \"not ok - $(__name \"$1\") (status $rc)\"; shift\n"
        "  for t; do echo \"not ok - $(__name \"$t\") (not run: an earlier test of its group failed)\"; done\n"
        "}\n"
        ": > \"$STR_SUITE_OKFILE\"\n"
        "set +e\n"
    )
    pending = []
    for st in statements(lines[plan + 1 :]):
        pending.append(st)
        if not has_ok(st):
            continue
        code = [i for i, l in enumerate(st) if l.strip() and not l.strip().startswith("#")]
        first, last = code[0], code[-1]
        head = st[first].strip()
        if head.startswith("for ") and head.endswith("do") and st[last].strip() == "done":
            # A top-level loop: its setup first, then each iteration's
            # tests one group at a time.
            if len(pending) > 1:
                emit_group(out, pending[:-1])
            out.extend(st[: first + 1])
            group = []
            for sub in statements(st[first + 1 : last]):
                group.append(sub)
                if has_ok(sub):
                    emit_group(out, group)
                    group = []
            if group:
                emit_group(out, group)
            out.extend(st[last:])
        else:
            emit_group(out, pending)
        pending = []
    if pending:
        emit_group(out, pending)
    sys.stdout.write("".join(out))


def outcomes(path, others=()):
    """The tests of one TAP file: (key, outcome) in order; a key repeated
    (the same test in another loop iteration) gets its count appended.
    others: the names the other side's file gives its tests."""
    seen, out = {}, []
    for line in open(path, errors="replace"):
        m = re.match(r"^(not ok|ok)\b\s*(.*)$", line.rstrip("\n"))
        if not m:
            continue
        msg = re.sub(r"^-\s*", "", m.group(2))
        msg = re.sub(r"\s*\((status \d+|not run: .*)\)$", "", msg)
        if m.group(1) == "not ok":
            outcome = "fail"
        elif "# skip" in msg.lower():
            outcome = "skip"
        else:
            outcome = "pass"
        if m.group(1) == "not ok":
            # A failed test is named by its "ok" line, with the
            # alternatives an if's branches print ("ok a | ok b").
            alts = [re.sub(r"^ok\b\s*(-\s*)?", "", a) for a in msg.split(" | ")]
            msg = next((a for a in alts if a in others), alts[0])
        seen[msg] = seen.get(msg, 0) + 1
        out.append((msg if seen[msg] == 1 else "%s [%d]" % (msg, seen[msg]), outcome))
    return out


def report(sides):
    names = [s.split("=", 1)[0] for s in sides]
    dirs = [s.split("=", 1)[1] for s in sides]
    files = sorted({f for d in dirs for f in os.listdir(d) if f.endswith(".tap")})
    totals = {n: {"pass": 0, "fail": 0, "skip": 0} for n in names}
    diffs = []
    for f in files:
        paths = [os.path.join(d, f) for d in dirs]
        plain = set()
        for p in paths:
            if os.path.exists(p):
                plain |= {re.sub(r" \[\d+\]$", "", k) for k, o in outcomes(p) if o != "fail"}
        results = []
        for n, p in zip(names, paths):
            r = outcomes(p, plain) if os.path.exists(p) else []
            for _, o in r:
                totals[n][o] += 1
            results.append(dict(r))
        keys = []
        for r in results:
            keys += [k for k in r if k not in keys]
        for k in keys:
            # A test one side never reached (its file timed out or
            # stopped) counts as failed there.
            got = [r.get(k, "not run") for r in results]
            for n, g in zip(names, got):
                if g == "not run":
                    totals[n]["fail"] += 1
            if len(set(got)) > 1:
                diffs.append("  %s: %s: %s" % (f[: -len(".tap")], k, ", ".join("%s %s" % (n, g) for n, g in zip(names, got))))
    w = max(len(n) for n in names)
    print("%-*s  %5s %5s %5s" % (w, "", "pass", "fail", "skip"))
    for n in names:
        t = totals[n]
        print("%-*s  %5d %5d %5d" % (w, n, t["pass"], t["fail"], t["skip"]))
    print("tests whose outcome differs: %d" % len(diffs))
    for d in diffs:
        print(d)


def unittest2tap():
    """The tests are the "test_x (...) ..." lines (their own output may
    follow on the same line and the next ones); the failures are named in
    the summary ("FAIL: test_x", "ERROR: test_x"); a run without its
    summary ("Ran N tests") fails every test it did not finish."""
    names, failed, skipped, summary = [], set(), {}, False
    for line in sys.stdin:
        line = line.rstrip("\n")
        m = re.match(r"^(test_\w+) \(.*?\) \.\.\. ?(.*)$", line)
        if m:
            names.append(m.group(1))
            if m.group(2).startswith("skipped"):
                skipped[m.group(1)] = m.group(2)[len("skipped"):].strip(" '")
        m = re.match(r"^(FAIL|ERROR): (test_\w+) ", line)
        if m:
            failed.add(m.group(2))
        if re.match(r"^Ran \d+ tests? in ", line):
            summary = True
    for n in names:
        if n in skipped:
            print("ok - %s # SKIP %s" % (n, skipped[n]))
        elif n in failed or not summary:
            print("not ok - %s" % n)
        else:
            print("ok - %s" % n)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "split":
        split(sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "unittest2tap":
        unittest2tap()
    elif len(sys.argv) >= 4 and sys.argv[1] == "report":
        report(sys.argv[2:])
    else:
        sys.exit(__doc__)

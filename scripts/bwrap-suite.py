#!/usr/bin/env python3
"""The parts of scripts/bwrap-suite.sh that are easier in Python.

asis TEST.sh: one of bubblewrap's shell tests as it is (it stops at its
first failure), with one change: a loop waiting for a file that a
background sandbox writes also ends when that sandbox has exited (else
the file hangs when the sandbox fails; see WAIT_LOOP).

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

results WORK: WORK/out/PASS-VARIANT-SIDE/FILE.tap holds one TAP output per
test file, pass (root, uid65534), variant (asis, split) and side (bwrap,
str). Writes WORK/results.tsv (every test's outcome on both sides),
WORK/counts.tsv (pass, fail, skip per pass, variant and side) and
WORK/differences.tsv (the tests that pass under bwrap and do not under
str), and prints them as tables. A test a side never reached (its file
stopped or timed out) counts as failed there ("not run").

check KNOWN WORK: the ratchet. KNOWN (test/bwrap-suite/known-differences.txt)
lists the tests that pass under bwrap and fail under str today, each with
its reason. Fails when a test passes under bwrap and fails under str but is
not listed (a regression, or a new difference to explain), and when a
listed test now passes under str (its line is to be deleted: the list only
shrinks). A line whose reason starts with "flaky:" is not checked either
way (the reason gives the evidence).

write-known KNOWN WORK: rewrite KNOWN from the last run's differences,
keeping the reason of every line still there (and every flaky line); a new
line's reason is "TODO: why"; prints what it added and removed.

lib libtest.sh: the library with its search for a FUSE mount disabled
(see FUSE_SEARCH).

usage: bwrap-suite.py lib libtest.sh > GENERATED.sh
       bwrap-suite.py asis TEST.sh > GENERATED.sh
       bwrap-suite.py split TEST.sh > GENERATED.sh
       bwrap-suite.py unittest2tap < OUTPUT > TAP
       bwrap-suite.py results WORK
       bwrap-suite.py check KNOWN WORK
       bwrap-suite.py write-known KNOWN WORK
"""
import os
import re
import sys

OK_ECHO = re.compile(r'^(\s*)echo\s+((["\']?)ok\b.*)$')
# bubblewrap >= 0.9's test-run.sh: `ok "name"`, `ok_skip "reason"` (its
# own functions, numbering the tests), and the plan printed at the end.
OK_CALL = re.compile(r"^(\s*)(ok|ok_skip)\s+([^\s(].*)$")
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
        alt = ok_alt(line)
        if alt:
            while len(result) <= cursor:
                result.append([])
            result[cursor].append(alt)
            cursor += 1
    return result


def ok_alt(line):
    """The words that name the test a line passes, for echo ("ok - NAME"),
    or None."""
    m = OK_ECHO.match(line)
    if m:
        return m.group(2)
    m = OK_CALL.match(line)
    if m:
        return "ok - " + ('"# SKIP" ' if m.group(2) == "ok_skip" else "") + m.group(3)
    return None


def has_ok(stmt):
    return any(ok_alt(l) for l in stmt)


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


# bubblewrap's userns and pidns tests start a sandbox in the background
# and wait for a file it writes with `while ! test -f F; do sleep 1; done`:
# when the sandbox fails before writing it, the loop never ends and the
# file hangs until the timeout. The one change made to a file "as it is":
# the loop also ends when the background job it waits for has exited (the
# test then fails on the missing file, as it would have had it not hung).
WAIT_LOOP = re.compile(r"^(\s*)while ! test -f (\S+); do sleep 1; done\s*$")


def read_lines(path):
    lines = open(path).read().splitlines(keepends=True)
    lines = [l if l.endswith("\n") else l + "\n" for l in lines]
    return [WAIT_LOOP.sub(r"\1while ! test -f \2; do kill -0 $! 2>/dev/null || break; sleep 1; done\n", l) for l in lines]


def asis(path):
    sys.stdout.write("".join(read_lines(path)))


# libtest.sh takes as FUSE_DIR any FUSE mount of the caller's uid found in
# /proc/self/mounts: a mount another program makes or removes during the
# run would change which tests run, on one side and not the other. Both
# sides skip the FUSE tests (the search reads /dev/null).
FUSE_SEARCH = re.compile(r"""grep " fuse\[\. \]" /proc/self/mounts""")


def lib(path):
    text = open(path).read()
    if not FUSE_SEARCH.search(text):
        sys.exit("bwrap-suite.py lib: %s: no FUSE mount search to disable" % path)
    sys.stdout.write(FUSE_SEARCH.sub('grep " fuse[. ]" /dev/null', text))


def split(path):
    lines = read_lines(path)
    # The setup runs as it is: up to the TAP plan line (echo "1..N"), or
    # with the plan at the end, up to the end of `done_testing ()`.
    plan = next((i for i, l in enumerate(lines) if re.match(r'^echo\s+["\']?1\.\.\d+', l)), None)
    wrap = ""
    if plan is None:
        start = next((i for i, l in enumerate(lines) if re.match(r"^done_testing\s*\(\)", l)), None)
        if start is None:
            sys.exit("bwrap-suite.py split: %s: no plan line (echo 1..N) and no done_testing ()" % path)
        plan = next(i for i in range(start, len(lines)) if lines[i].rstrip() == "}")
        wrap = 'eval "__suite_$(declare -f ok)"; ok() { __suite_ok "$@"; echo >> "$STR_SUITE_OKFILE"; }\n'
    out = lines[: plan + 1]
    out.append(
        "# --- rewritten by str's scripts/bwrap-suite.py split: one subshell per test ---\n"
        + wrap +
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
    if not os.path.exists(path):
        return out
    for line in open(path, errors="replace"):
        m = re.match(r"^(not ok|ok)\b\s*(.*)$", line.rstrip("\n"))
        if not m:
            continue
        # "ok - NAME" (bubblewrap < 0.9), "ok N NAME" (>= 0.9: NAME may
        # start with "--").
        msg = re.sub(r"^(\d+\s+)?(-(\s+|$))?", "", m.group(2))
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
        msg = msg.replace("\t", " ").strip()
        # A skipped test is named without its reason when it has a name.
        msg = re.sub(r"^(.*\S)\s+# skip\b.*$", r"\1", msg, flags=re.I)
        seen[msg] = seen.get(msg, 0) + 1
        out.append((msg if seen[msg] == 1 else "%s [%d]" % (msg, seen[msg]), outcome))
    return out


PASSES = ("root", "uid65534")
VARIANTS = ("asis", "split")
SIDES = ("bwrap", "str")
FIELDS = ("pass", "variant", "file", "test")


def compare(work):
    """Every test's outcome on both sides: rows (pass, variant, file, test,
    bwrap outcome, str outcome), in the files' order."""
    rows = []
    for who in PASSES:
        for variant in VARIANTS:
            dirs = [os.path.join(work, "out", "%s-%s-%s" % (who, variant, side)) for side in SIDES]
            if not all(os.path.isdir(d) for d in dirs):
                continue
            files = sorted({f for d in dirs for f in os.listdir(d) if f.endswith(".tap")})
            for f in files:
                paths = [os.path.join(d, f) for d in dirs]
                plain = set()
                for p in paths:
                    plain |= {re.sub(r" \[\d+\]$", "", k) for k, o in outcomes(p) if o != "fail"}
                results = [dict(outcomes(p, plain)) for p in paths]
                keys = []
                for r in results:
                    keys += [k for k in r if k not in keys]
                for k in keys:
                    rows.append((who, variant, f[: -len(".tap")], k) + tuple(r.get(k, "not run") for r in results))
    return rows


def differs(row):
    """Passes under bwrap, does not under str (fails, is skipped or is not reached)."""
    return row[4] == "pass" and row[5] != "pass"


def write_tsv(path, header, rows):
    with open(path, "w") as f:
        f.write("\t".join(header) + "\n")
        for r in rows:
            f.write("\t".join(str(x) for x in r) + "\n")


def results(work):
    rows = compare(work)
    write_tsv(os.path.join(work, "results.tsv"), FIELDS + SIDES, rows)
    counts = {}
    for r in rows:
        for side, outcome in zip(SIDES, r[4:]):
            c = counts.setdefault((r[0], r[1], side), {"pass": 0, "fail": 0, "skip": 0})
            c["fail" if outcome == "not run" else outcome] += 1
    write_tsv(os.path.join(work, "counts.tsv"), ("pass", "variant", "side", "passed", "failed", "skipped"),
              [k + (c["pass"], c["fail"], c["skip"]) for k, c in sorted(counts.items())])
    diffs = [r for r in rows if differs(r)]
    write_tsv(os.path.join(work, "differences.tsv"), FIELDS + SIDES, diffs)
    runs = sorted({(r[0], r[1]) for r in rows}, key=lambda k: (PASSES.index(k[0]), VARIANTS.index(k[1])))
    print("| run | bwrap passes | str passes | pass under bwrap, fail under str |")
    print("|---|---:|---:|---:|")
    for who, variant in runs:
        cb, cs = counts[(who, variant, "bwrap")], counts[(who, variant, "str")]
        n = sum(1 for r in diffs if r[:2] == (who, variant))
        print("| %s, %s | %d | %d | %d |" % (who, variant, cb["pass"], cs["pass"], n))
    print()
    print("pass / fail / skip (a test a side never reached counts as failed there):")
    for who, variant in runs:
        print("  %-8s %-5s  bwrap %s  str %s" % (who, variant, *(
            "%3d / %3d / %3d" % (counts[(who, variant, s)]["pass"], counts[(who, variant, s)]["fail"], counts[(who, variant, s)]["skip"]) for s in SIDES)))
    print()
    print("tests that pass under bwrap and not under str: %d" % len(diffs))
    for r in diffs:
        print("  %s %s %s: %s (str: %s)" % (r[0], r[1], r[2], r[3], r[5]))


def read_known(path):
    """KNOWN's lines: {(pass, variant, file, test): reason}, in order."""
    known = {}
    for n, line in enumerate(open(path), 1):
        line = line.rstrip("\n")
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split("\t")
        if len(f) != 5 or f[0] not in PASSES or f[1] not in VARIANTS or not f[4].strip():
            sys.exit("%s:%d: want PASS<TAB>VARIANT<TAB>FILE<TAB>TEST<TAB>REASON (PASS one of %s, VARIANT one of %s, a reason): %r"
                     % (path, n, "|".join(PASSES), "|".join(VARIANTS), line))
        if tuple(f[:4]) in known:
            sys.exit("%s:%d: listed twice: %s" % (path, n, " ".join(f[:4])))
        known[tuple(f[:4])] = f[4]
    return known


def flaky(reason):
    return reason.startswith("flaky:")


def check(known_path, work):
    known = read_known(known_path)
    rows = {r[:4]: r for r in compare(work)}
    runs = {k[:2] for k in rows}
    new = [r for k, r in rows.items() if differs(r) and k not in known]
    fixed, gone = [], []
    for k, reason in known.items():
        if flaky(reason) or k[:2] not in runs:
            continue  # a flaky test, or a pass or variant this run did not make
        r = rows.get(k)
        if r is None:
            gone.append(k)
        elif r[5] == "pass":
            fixed.append(k)
    for r in new:
        print("bwrap-suite: NEW DIFFERENCE: %s %s %s: %s: passes under bwrap, %s under str (a regression, or a difference to fix or to list in %s with its reason)"
              % (r[0], r[1], r[2], r[3], r[5], known_path))
    for k in fixed:
        print("bwrap-suite: FIXED: %s %s %s: %s now passes under str: delete its line from %s" % (k + (known_path,)))
    for k in gone:
        print("bwrap-suite: GONE: %s %s %s: %s: no such test in this run (renamed, or the suite changed): delete its line from %s" % (k + (known_path,)))
    nflaky = sum(1 for k, reason in known.items() if flaky(reason) and k[:2] in runs)
    if new or fixed or gone:
        print("bwrap-suite: the ratchet FAILED (%d new, %d fixed, %d gone); scripts/bwrap-suite.sh --write-known rewrites the list from this run"
              % (len(new), len(fixed), len(gone)))
        sys.exit(1)
    print("bwrap-suite: the ratchet holds: %d known differences (%d of them flaky, not checked), none new, none fixed"
          % (len(known), nflaky))


HEADER = """\
# The tests of bubblewrap's own suite that pass under the machine's bwrap and
# fail under `str bwrap` today (make bwrap-suite; docs/bwrap.md, "bubblewrap's
# own test suite"). One line each, tab-separated:
#   PASS (root|uid65534)  VARIANT (asis|split)  FILE  TEST (as the suite names it)  REASON
# make bwrap-suite fails when a test passes under bwrap and fails under str
# but is not listed here, and when a listed test passes under str (delete its
# line): the list only shrinks. A reason starting with "flaky:" (with the
# evidence) makes the check ignore that test's outcome. Issue 31 is done when
# no line is left. scripts/bwrap-suite.sh --write-known rewrites it from the
# last run, keeping the reasons.
"""


def write_known(known_path, work):
    known = read_known(known_path) if os.path.exists(known_path) else {}
    rows = compare(work)
    runs = {r[:2] for r in rows}
    keep = {}
    for r in rows:
        k = r[:4]
        if differs(r) or (k in known and flaky(known[k])):
            keep[k] = known.get(k, "TODO: why")
    # A pass or variant the last run did not make keeps its lines.
    for k, reason in known.items():
        if k[:2] not in runs:
            keep[k] = reason
    with open(known_path, "w") as f:
        f.write(HEADER)
        for k, reason in keep.items():
            f.write("\t".join(k + (reason,)) + "\n")
    for k in keep:
        if k not in known:
            print("added:   %s (reason: TODO)" % " ".join(k))
    for k in known:
        if k not in keep:
            print("removed: %s" % " ".join(k))
    print("%s: %d lines" % (known_path, len(keep)))


def unittest2tap():
    """The tests are the "test_x (...) ..." lines (their own output may
    follow on the same line and the next ones); the failures are named in
    the summary ("FAIL: test_x", "ERROR: test_x"); a run without its
    summary ("Ran N tests") fails every test it did not finish."""
    names, failed, skipped, summary = [], set(), {}, False
    for line in sys.stdin:
        line = line.rstrip("\n")
        m = re.match(r"^1\.\.0 # SKIP (.*)$", line)
        if m:
            # The whole file skipped itself (no seccomp module): one line
            # says so, and the tests the other side ran count as not run.
            print("ok - the whole file # SKIP %s" % m.group(1))
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
    cmd, args = sys.argv[1] if len(sys.argv) > 1 else "", sys.argv[2:]
    if cmd == "lib" and len(args) == 1:
        lib(args[0])
    elif cmd == "asis" and len(args) == 1:
        asis(args[0])
    elif cmd == "split" and len(args) == 1:
        split(args[0])
    elif cmd == "unittest2tap" and not args:
        unittest2tap()
    elif cmd == "results" and len(args) == 1:
        results(args[0])
    elif cmd == "check" and len(args) == 2:
        check(*args)
    elif cmd == "write-known" and len(args) == 2:
        write_known(*args)
    else:
        sys.exit(__doc__)

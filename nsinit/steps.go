package nsinit

import (
	"errors"
	"strconv"
	"syscall"
)

// Step identifies one step of the sandbox setup. The init's steps are
// numbered in the order a Program performs them; the launcher's are L1..L10. The
// same constants name the step in every StepError and in compileDirect's code, and
// SECURITY.md lists them (TestStepListsAgree checks that the two agree).
type Step int

// The init's steps, in order. Each one's title is in stepTitles.
const (
	StepReadPlan     Step = iota // 0
	StepCloseFDs                 // 1
	StepMakePrivate              // 2
	StepCloneSources             // 3
	StepRootTmpfs                // 4
	StepMounts                   // 5
	StepPivotRoot                // 6
	StepRootReadOnly             // 7
	StepChdir                    // 8
	StepHostname                 // 9
	StepLoopback                 // 10
	StepResolveTool              // 11
	StepEnterCgroup              // 12
	StepDropBounding             // 13
	StepClearAmbient             // 14
	StepSetIDs                   // 15
	StepClearCaps                // 16
	StepParentDeath              // 17
	StepNoNewPrivs               // 18
	StepSeccomp                  // 19
	StepRlimits                  // 20
	StepExec                     // 21
	numInitSteps
)

// The init's sub-steps: a part of the sequence that only some sandboxes
// run, numbered after the step it follows ("10a"), so that the steps
// after it keep their numbers. Each one's place and title are in subSteps.
const (
	StepAwaitCall    Step = 201 + iota // 10a: a pre-built sandbox (Config.AwaitCall) waits for its call
	StepHandListener                   // 19a: a per-tool template (Config.SeccompListener) hands its filter's listener over
	StepJoinNS                         // 0a: str bwrap's --userns, --pidns (Config.Join): join the caller's namespaces and fork
	numSubStepsEnd
)

// subSteps places each sub-step (the step it follows, its letter) and
// says what it does (DocList prints the title after the step it follows).
var subSteps = map[Step]struct {
	after         Step
	letter, title string
}{
	StepAwaitCall:    {StepLoopback, "a", "pre-built sandbox (str serve): wait for the call on the report socket (argv, environment, stdio as SCM_RIGHTS) and dup3 the stdio onto 0-2"},
	StepHandListener: {StepSeccomp, "a", "per-tool template: hand the seccomp filter's listener to the launcher (SCM_RIGHTS on the report socket) and close it"},
	StepJoinNS:       {StepReadPlan, "a", "a bubblewrap line's --userns (Config.Join): setns into the caller's user namespace, unshare the others in it, setns into --pidns's pid namespace or make one, and fork: the child runs the steps from 1 on, the clone child waits for it and exits as it did"},
}

// The launcher's steps (who "launcher"): L1..L10: create the cgroup (and
// lease the host ids), make the report socket, clone the bind sources on
// the host, compile the init's program and clone the child that runs it,
// open the cgroup v1 tasks files to the init, the plan (L6: it is the
// child's program, nothing is sent and nothing fails there any more),
// time out or cancel, tear down; L9, for a sandbox made through
// the launcher's Provider, make its work dir (after L1, before L2: its
// tmpfs belongs to the leased ids) and remove it after L8; and L10, for
// a capped `str run --workdir` (Mount.WriteBack), copy what the tool
// changed back into the caller's directory once the sandbox has ended.
const (
	StepLCgroup      Step = 101 + iota // L1
	StepLPipes                         // L2
	StepLBindSources                   // L3
	StepLClone                         // L4
	StepLCgroupOwner                   // L5
	StepLSendPlan                      // L6
	StepLTimeout                       // L7
	StepLTeardown                      // L8
	StepLWorkDir                       // L9
	StepLWriteBack                     // L10
)

// stepTitles is the one list of what each init step does: compileDirect's doc
// comment and SECURITY.md carry exactly these lines.
var stepTitles = [numInitSteps]string{
	StepReadPlan:     "the plan is the program the launcher's clone child runs: nothing to read",
	StepCloseFDs:     "move the launcher's descriptors above the tool's, close the others, dup3 0-2 and the pass-list into place and mark every fd past them close-on-exec",
	StepMakePrivate:  "make / private, recursively",
	StepCloneSources: "take each bind source's detached tree (the launcher's descriptor, or open_tree here when rootless) and open the cgroup v1 tasks files",
	StepRootTmpfs:    "mount a fresh tmpfs as the new root",
	StepMounts:       "perform the planned mounts in order",
	StepPivotRoot:    "pivot_root into the new root and detach the old one",
	StepRootReadOnly: "remount the new root read-only (a bubblewrap line's: give its own entries to the command, writable, instead)",
	StepChdir:        "chdir into the work dir and check getcwd",
	StepHostname:     "set the hostname",
	StepLoopback:     "bring up loopback and hand the egress listeners to the launcher",
	StepResolveTool:  "resolve the tool's path and build argv and envp",
	StepEnterCgroup:  "cgroup v1: move this thread into the sandbox's cgroup (write 0 to each tasks file)",
	StepDropBounding: "drop the capability bounding set (all but the kept ones, Config.Caps)",
	StepClearAmbient: "clear the ambient capabilities",
	StepSetIDs:       "set groups, gid, uid",
	StepClearCaps:    "set the effective and permitted capabilities to the kept ones (none by default), the inheritable ones inheritable and ambient",
	StepParentDeath:  "re-arm the parent-death signal and check the launcher is alive",
	StepNoNewPrivs:   "set no_new_privs",
	StepSeccomp:      "load seccomp",
	StepRlimits:      "set the rlimits (raw prlimit64, RLIMIT_AS last)",
	StepExec:         "execve the tool (raw syscall): the tool becomes PID 1",
}

// String is "5" for an init step, "10a" for a sub-step and "L1" for a
// launcher step.
func (s Step) String() string {
	if sub, ok := subSteps[s]; ok {
		return strconv.Itoa(int(sub.after)) + sub.letter
	}
	if s > StepLCgroup-1 {
		return "L" + strconv.Itoa(int(s-StepLCgroup)+1)
	}
	return strconv.Itoa(int(s))
}

// DocList is the numbered list of the init's steps as SECURITY.md prints
// it ("  0. read the plan ...").
// A sub-step follows the step it belongs after ("  10a. ...").
func DocList() []string {
	out := make([]string, 0, int(numInitSteps)+len(subSteps))
	for s := Step(0); s < numInitSteps; s++ {
		out = append(out, strconv.Itoa(int(s))+". "+stepTitles[s])
		for sub := StepAwaitCall; sub < numSubStepsEnd; sub++ {
			if subSteps[sub].after == s {
				out = append(out, sub.String()+". "+subSteps[sub].title)
			}
		}
	}
	return out
}

// StepError is the one error type of the sandbox setup, on both sides of
// the clone. It names who failed (Who: "nsinit" or "launcher"), the
// numbered step, the object (a path, a file, a syscall argument), and
// wraps the cause. Hint is set where the cause is common and has a known fix.
//
//	nsinit: bind-mount /usr -> /newroot/usr (step 5, MS_BIND|MS_REC): operation not permitted
type StepError struct {
	Who    string `json:"who"`
	Step   Step   `json:"step"`
	Action string `json:"action"` // "bind-mount", "pivot_root", "setrlimit", ...
	Path   string `json:"path,omitempty"`
	Detail string `json:"detail,omitempty"` // flags or argument, e.g. "MS_BIND|MS_REC"
	Hint   string `json:"hint,omitempty"`
	Errno  int    `json:"errno,omitempty"`
	Msg    string `json:"error"` // the cause as text (survives the pipe)
	Err    error  `json:"-"`
}

func (e *StepError) Error() string {
	s := e.Who + ": " + e.Action
	if e.Path != "" {
		s += " " + e.Path
	}
	s += " (step " + e.Step.String()
	if e.Detail != "" {
		s += ", " + e.Detail
	}
	s += "): " + e.Msg
	if e.Hint != "" {
		s += " (hint: " + e.Hint + ")"
	}
	return s
}

// Unwrap returns the cause; after a trip through JSON (a worker's reply) only the
// errno survives, so it is rebuilt from Errno.
func (e *StepError) Unwrap() error {
	if e.Err == nil && e.Errno != 0 {
		return syscall.Errno(e.Errno)
	}
	return e.Err
}

// stepErr builds a StepError for nsinit; errno is kept so that the parent
// can still match the cause with errors.Is after the JSON round trip.
func stepErr(step Step, action, path, detail string, err error) *StepError {
	se := &StepError{Who: "nsinit", Step: step, Action: action, Path: path, Detail: detail, Err: err}
	if err != nil {
		se.Msg = err.Error()
		var en syscall.Errno
		if errors.As(err, &en) {
			se.Errno = int(en)
		}
	}
	return se
}

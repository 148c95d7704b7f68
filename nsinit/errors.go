package nsinit

import (
	"errors"
	"syscall"
)

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

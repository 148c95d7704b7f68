package nsinit

import "fmt"

// ConfigVersion is the version of Config's form, as a plan shows it (2:
// the launcher passes the bind sources' trees, Mount.TreeFD).
const ConfigVersion = 2

// Event is what one message on the report socket says, child ->
// launcher (a unix SOCK_SEQPACKET socketpair; Program.Event reads the
// child's fixed records). The socket is close-on-exec, so the tool never
// holds it; the launcher sees EOF when the child has become the tool
// (execve) or has exited.
type Event struct {
	Type    string     // "warning", "error", "listeners", "seccomp_listener" (sub-step 19a), "await_call" (sub-step 10a)
	Message string     // a warning's text
	Error   *StepError // an error's
	// Listeners names the descriptors of a "listeners" event, in the order
	// they travel as SCM_RIGHTS with it.
	Listeners []Listener
}

// checkFilter: filter is 1 to maxBPFInsns whole sock_filter records (the
// one check of a Program's step 19).
func checkFilter(filter []byte) error {
	if len(filter) == 0 || len(filter)%8 != 0 || len(filter)/8 > maxBPFInsns {
		return fmt.Errorf("seccomp program of %d bytes is not 1-%d sock_filter records", len(filter), maxBPFInsns)
	}
	return nil
}

// maxBPFInsns is the kernel's BPF_MAXINSNS.
const maxBPFInsns = 4096

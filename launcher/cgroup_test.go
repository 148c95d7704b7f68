package launcher

import (
	"slices"
	"testing"
)

// TestV2MissingControllers: a cgroup.subtree_control line is a list of
// whole names. "cpuset" does not stand for "cpu" (nor "hugetlb" for
// anything), so a parent with only cpuset, hugetlb and memory enabled
// still needs cpu and pids.
func TestV2MissingControllers(t *testing.T) {
	want := []string{"memory", "pids", "cpu"}
	for _, c := range []struct {
		file    string
		missing []string
	}{
		{"", []string{"memory", "pids", "cpu"}},
		{"cpuset memory\n", []string{"pids", "cpu"}},
		{"cpuset hugetlb memory rdma\n", []string{"pids", "cpu"}},
		{"cpuset cpu io memory hugetlb pids rdma misc\n", nil},
		{"memory pids cpu", nil},
		{"  cpu\tmemory \n pids\n", nil},
		{"memorycpu pids", []string{"memory", "cpu"}},
	} {
		if got := v2MissingControllers([]byte(c.file), want); !slices.Equal(got, c.missing) {
			t.Errorf("%q: missing %q, want %q", c.file, got, c.missing)
		}
	}
}

package procfs

import "testing"

// Mount points with the kernel's octal escapes (space, tab, newline,
// backslash) read back as the paths they are; a backslash not followed by
// three octal digits stays as it is.
func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/a\040b/c`: "/a b/c", `/t\011x`: "/t\tx", `/n\012`: "/n\n", `/b\134s`: `/b\s`,
		`/plain`: "/plain", `/x\09`: `/x\09`, `/end\`: `/end\`,
	} {
		if got := UnescapeMountinfo(in); got != want {
			t.Errorf("UnescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

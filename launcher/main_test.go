package launcher

import (
	"testing"

	"github.com/securetoolruntime/str/internal/testbin"
)

// The sandboxes these tests make need the egress helper (cmd/str-egress).
func TestMain(m *testing.M) { testbin.Main(m) }

package intercept

import (
	"slices"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/nsinit"
)

// TestCheckBundleHidden: a mount on the bundle, or on a directory above
// it other than a tmpfs or /, is refused; a tmpfs above it is not (the
// bundle is a file made on it).
func TestCheckBundleHidden(t *testing.T) {
	policy := egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"api.example.com"}}
	for _, c := range []struct {
		m    nsinit.Mount
		hide bool
	}{
		{nsinit.Mount{Kind: nsinit.MountBind, Source: "/x", Target: BundlePath}, true},
		{nsinit.Mount{Kind: nsinit.MountBind, Source: "/x", Target: "/etc/str"}, true},
		{nsinit.Mount{Kind: nsinit.MountBind, Source: "/x", Target: "/etc"}, true},
		{nsinit.Mount{Kind: nsinit.MountTmpfs, Target: "/etc"}, false},
		{nsinit.Mount{Kind: nsinit.MountBind, Source: "/x", Target: "/"}, false},
		{nsinit.Mount{Kind: nsinit.MountBind, Source: "/x", Target: "/etc/strange"}, false},
	} {
		err := Check(policy, nil, []nsinit.Mount{c.m})
		if got := err != nil && strings.Contains(err.Error(), "hides the CA bundle"); got != c.hide {
			t.Errorf("%s %s: %v, want hidden %v", c.m.Kind, c.m.Target, err, c.hide)
		}
	}
}

// TestAdd: the bundle is a read-only generated file ending with the CA's
// certificate (never its key), and the variables that point at it replace
// any earlier value, sorted.
func TestAdd(t *testing.T) {
	caPEM := "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	mounts, env, err := Add(nil, []string{"SSL_CERT_FILE=/elsewhere", "A=1"}, nil, []byte(caPEM))
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 1 || mounts[0].Kind != nsinit.MountFile || mounts[0].Target != BundlePath || mounts[0].Mode != 0o444 ||
		!strings.HasSuffix(mounts[0].Contents, caPEM) {
		t.Errorf("mounts %+v", mounts)
	}
	if !slices.IsSorted(env) || slices.Contains(env, "SSL_CERT_FILE=/elsewhere") || !slices.Contains(env, "SSL_CERT_FILE="+BundlePath) || !slices.Contains(env, "A=1") {
		t.Errorf("env %q", env)
	}
	if egress.Terminates(egress.Policy{}, nil) {
		t.Error("a sandbox with no credential and no http_rules terminates TLS")
	}
}

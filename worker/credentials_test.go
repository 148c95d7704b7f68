package worker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A tool with credentials is never pooled (its placeholder is its call's
// own); each call reads the secret anew and gets a fresh placeholder; the
// value is never in the reply.
func TestCredentialToolsColdWithFreshPlaceholders(t *testing.T) {
	h := newWarmHarness(t, nil)
	secret := filepath.Join(h.dir, "secret")
	must(t, os.WriteFile(secret, []byte("worker-test-secret\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(h.dir, "tools", "credtools.py"), []byte(`
import os
def token(ctx):
    return {"tok": os.environ.get("API_TOKEN", "")}
`), 0o644))
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(`version: 1
tools:
  echo_input: {module: warmtools, function: echo_input, warm: 1, timeout_seconds: 60}
  cred:
    module: credtools
    function: token
    warm: 1
    network: {policy: restricted, allowed_hosts: [api.test]}
    credentials: [{name: API_TOKEN, from: "file:`+secret+`", hosts: [api.test], header: Authorization}]
`), 0o644))
	h.start()
	waitPoolSize(t, h, "echo_input", 1)
	if v := metricValue(t, h, `str_worker_warm_pool_size{tool="cred"}`); v != 0 {
		t.Errorf("the credential tool has %v pooled sandboxes", v)
	}
	var seen []string
	for i := 0; i < 2; i++ {
		reply := h.reply(h.send("cred", map[string]any{}))
		if strings.Contains(string(reply), "worker-test-secret") {
			t.Fatalf("the reply carries the secret: %s", reply)
		}
		tok, _ := resultOf(t, reply)["tok"].(string)
		if !strings.HasPrefix(tok, "str-placeholder-") {
			t.Fatalf("API_TOKEN = %q, want a placeholder", tok)
		}
		seen = append(seen, tok)
	}
	if seen[0] == seen[1] {
		t.Error("two calls got the same placeholder")
	}
	// A secret that cannot be read fails the call, naming the credential
	// and its source (the worker's configuration), never a value.
	must(t, os.Remove(secret))
	reply := string(h.reply(h.send("cred", map[string]any{})))
	if !strings.Contains(reply, "SANDBOX_FAILED") || !strings.Contains(reply, "API_TOKEN") || !strings.Contains(reply, "credentials") {
		t.Errorf("missing secret: %s", reply)
	}
}

package artifacts

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAuditRequester: issue 16 §1. The audit log records who the worker
// verified a call to be from (WithRequester), verified or not; a line
// without one (an eviction) has no requester.
func TestAuditRequester(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "audit.jsonl")
	fs, err := NewFilesystem(t.TempDir(), "ns", WithAuditLog(logPath))
	if err != nil {
		t.Fatal(err)
	}
	mem := NewMemory("ns", WithAuditLog(logPath))
	verified := WithRequester(context.Background(), "verified:alice", "key:orders")
	unverified := WithRequester(context.Background(), "unverified:bob", "")
	for _, s := range []Store{fs, mem} {
		if _, err := s.Save(verified, "alice", "s", "a.txt", []byte("x"), ""); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Load(unverified, "bob", "s", "a.txt", nil); err == nil {
			t.Fatal("bob loaded alice's session artifact")
		}
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ requester, via string }{
		{"verified:alice", "key:orders"}, {"unverified:bob", ""}, {"verified:alice", "key:orders"}, {"unverified:bob", ""},
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines:\n%s", len(lines), b)
	}
	for i, line := range lines {
		var l auditLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		if l.Requester != want[i].requester || l.VerifiedBy != want[i].via {
			t.Errorf("line %d: requester %q verified_by %q, want %+v", i, l.Requester, l.VerifiedBy, want[i])
		}
	}
}

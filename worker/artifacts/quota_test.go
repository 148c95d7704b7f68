package artifacts

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestQuota: on both stores, a user over their byte or version quota, or
// over their session's, is refused with ErrQuota naming the setting, and
// nothing is stored; another user, and the same user in another session
// (within the user's quota), still save; user: artifacts count for the
// user, not the session.
func TestQuota(t *testing.T) {
	ctx := context.Background()
	stores := map[string]func(t *testing.T) Store{
		"memory": func(t *testing.T) Store { return NewMemory("ns/") },
		"filesystem": func(t *testing.T) Store {
			st, err := NewFilesystem(t.TempDir(), "ns/")
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
	}
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			st := WithQuota(mk(t), Quota{UserBytes: 100, UserVersions: 5, SessionBytes: 60, SessionVersions: 3})
			save := func(user, session, file string, n int) error {
				_, err := st.Save(ctx, user, session, file, make([]byte, n), "")
				return err
			}
			refused := func(err error, setting string) {
				t.Helper()
				var qe *QuotaError
				if !errors.Is(err, ErrQuota) || !errors.As(err, &qe) || qe.Setting != setting || !strings.Contains(err.Error(), setting) {
					t.Fatalf("want a refusal by %s, got %v", setting, err)
				}
			}
			// Session bytes: 50 fit, 20 more do not (60).
			if err := save("alice", "s1", "a.bin", 50); err != nil {
				t.Fatal(err)
			}
			refused(save("alice", "s1", "b.bin", 20), "ARTIFACT_SESSION_MAX_BYTES")
			if v, _ := st.ListVersions(ctx, "alice", "s1", "b.bin"); len(v) != 0 {
				t.Fatalf("a refused save stored versions %v", v)
			}
			// Another session of alice, and another user, still save.
			if err := save("alice", "s2", "a.bin", 40); err != nil {
				t.Fatal(err)
			}
			if err := save("bob", "s1", "user:a.bin", 90); err != nil {
				t.Fatal(err)
			}
			// User bytes: alice has 90; 20 more (user: scope) do not fit 100.
			refused(save("alice", "s3", "user:u.bin", 20), "ARTIFACT_USER_MAX_BYTES")
			// Versions: three small ones in s3 fill the session's 3.
			for i := 0; i < 3; i++ {
				if err := save("alice", "s3", "v.txt", 1); err != nil {
					t.Fatal(err)
				}
			}
			// alice now has 5 versions (a, a, v, v, v): the user's cap.
			refused(save("alice", "s4", "w.txt", 1), "ARTIFACT_USER_MAX_VERSIONS")
			if err := save("bob", "s2", "w.txt", 1); err != nil {
				t.Fatalf("bob refused for alice's quota: %v", err)
			}
			// The batch check says the same without storing.
			qc := st.(QuotaChecker)
			refused(qc.CheckQuota(ctx, "bob", "s1", []string{"x", "y"}, []int64{5, 5}), "ARTIFACT_USER_MAX_BYTES")
			if err := qc.CheckQuota(ctx, "bob", "s3", []string{"x"}, []int64{5}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestQuotaSessionVersions: the session's version cap.
func TestQuotaSessionVersions(t *testing.T) {
	st := WithQuota(NewMemory("ns/"), Quota{SessionVersions: 2})
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if _, err := st.Save(ctx, "u", "s", "f.txt", []byte("x"), ""); err != nil {
			t.Fatal(err)
		}
	}
	_, err := st.Save(ctx, "u", "s", "f.txt", []byte("x"), "")
	if !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "ARTIFACT_SESSION_MAX_VERSIONS") {
		t.Fatalf("third version: %v", err)
	}
	if _, err := st.Save(ctx, "u", "s", "user:f.txt", []byte("x"), ""); err != nil {
		t.Fatalf("a user: artifact counts against the session: %v", err)
	}
	if WithQuota(NewMemory("ns/"), Quota{}).(*memoryStore) == nil {
		t.Fatal("no quota: the store itself")
	}
}

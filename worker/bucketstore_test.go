package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/objstoretest"
	"github.com/securetoolruntime/str/worker/artifacts"
)

// The s3 store (a real S3 server, internal/objstoretest) down while the
// worker serves: a call's outputs are answered ARTIFACT_ERROR naming the
// store's error, nothing saved; a call without outputs succeeds; /readyz
// is 503 with the artifact_store fault. The store back: /readyz is 200
// again and outputs are saved, with no restart.
func TestS3StoreDownWhileServing(t *testing.T) {
	srv := objstoretest.S3(t)
	st, _, err := artifacts.Open(artifacts.Settings{Type: "s3", Namespace: "test/ns/",
		S3: artifacts.S3Settings{Bucket: objstoretest.Bucket, Endpoint: srv.Endpoint()}})
	must(t, err)
	h := newOutputHarness(t, nil, func(o *Options) { o.Store = st })
	h.store = st
	h.start()
	if code, b := readyz(t, h); code != 200 || b.Faults != nil {
		t.Fatalf("readyz before: %d %+v", code, b)
	}
	args := map[string]any{"args": map[string]any{"n": 1, "mb": 1}}

	srv.Stop()
	code, msg := errorCode(t, h.reply(h.send("big_outputs", args)))
	if code != "ARTIFACT_ERROR" || !strings.Contains(msg, "s3 store") || !strings.Contains(msg, "connection refused") || !strings.Contains(msg, "nothing was saved") {
		t.Errorf("outputs with the store down: %s %s", code, msg)
	}
	if _, ok := shapeResult(h.reply(h.send("echo", nil))); !ok {
		t.Error("a call without outputs failed while the store is down")
	}
	// A failed save is not a fault by itself (a missing artifact is not
	// either): the bucket check at the next /readyz finds it.
	time.Sleep(resourceCheckMinAge)
	if hc, b := readyz(t, h); hc != 503 || !strings.Contains(b.Faults[faultArtifactStore], "s3 store") {
		t.Errorf("readyz with the store down: %d %+v", hc, b)
	}

	srv.Start()
	time.Sleep(resourceCheckMinAge) // the next /readyz checks again
	if hc, b := readyz(t, h); hc != 200 || b.Faults != nil {
		t.Errorf("readyz with the store back: %d %+v", hc, b)
	}
	if _, ok := shapeResult(h.reply(h.send("big_outputs", args))); !ok {
		t.Fatal("outputs with the store back failed")
	}
	a, err := st.Load(context.Background(), "u1", "s1", "big0.bin", nil)
	if err != nil || len(a.Data) != 1<<20 || a.Version != 0 {
		t.Fatalf("the saved output: %v", err)
	}
}

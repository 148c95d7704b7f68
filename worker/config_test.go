package worker

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigDefaults(t *testing.T) {
	c, err := LoadConfig(nil, envOf(map[string]string{"SAM_NAMESPACE": "demo/", "DEV_BROKER_HOST": "localhost"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.WorkerID != "sandbox-worker-001" || c.ManifestPath != "/tools/manifest.yaml" || c.ToolsDir != "/tools/python" ||
		c.DefaultTimeout != 300*time.Second || c.DevBrokerPort != 55555 || c.ConnectRetries != 0 ||
		c.ConnectRetryDelay != 3*time.Second || c.SolaceVPN != "default" || c.SolaceReconnectTries != 10 ||
		c.SolaceReconnectDelay != 3*time.Second || c.WorkDir != "/sandbox/work" || c.DefaultProfile != "standard" ||
		c.MaxConcurrent != 4 || c.ArtifactType != "memory" || c.ArtifactBasePath != "/sam/artifacts" ||
		c.HealthPort != 8081 || c.MaxPayloadBytes != DefaultMaxPayloadBytes || c.ShutdownGrace != 30*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	if c.Base() != "demo/a2a/v1" || c.QueueName() != "demo/q/sandbox/sandbox-worker-001" {
		t.Fatalf("base %s queue %s", c.Base(), c.QueueName())
	}
}

func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "w.yaml")
	os.WriteFile(file, []byte("SAM_NAMESPACE: file/\nSAM_WORKER_ID: from-file\nSANDBOX_MAX_CONCURRENT: 2\nHEALTH_PORT: 9000\nDEV_BROKER_HOST: h\n"), 0o600)
	env := map[string]string{"SAM_WORKER_ID": "from-env", "SANDBOX_MAX_CONCURRENT": "3", "HEALTH_PORT": ""}
	c, err := LoadConfig([]string{"--config", file, "--max-concurrent", "5"}, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Namespace != "file/" || c.WorkerID != "from-env" || c.MaxConcurrent != 5 || c.HealthPort != 9000 {
		t.Fatalf("precedence: ns %s id %s max %d port %d", c.Namespace, c.WorkerID, c.MaxConcurrent, c.HealthPort)
	}
}

func TestConfigErrorsCollected(t *testing.T) {
	_, err := LoadConfig([]string{"--max-concurrent", "zero", "--artifact-type", "azure"},
		envOf(map[string]string{"HEALTH_PORT": "x"}), io.Discard)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, w := range []string{"SAM_NAMESPACE", "SANDBOX_MAX_CONCURRENT", "ARTIFACT_SERVICE_TYPE", "HEALTH_PORT", "no broker"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %s: %v", w, err)
		}
	}
	if _, err := LoadConfig([]string{"--namespace", "/", "--dev-broker-host", "h"}, envOf(nil), io.Discard); err == nil ||
		!strings.Contains(err.Error(), "empty namespace") {
		t.Fatalf("empty namespace: %v", err)
	}
}

// ARTIFACT_SERVICE_TYPE=s3: a bucket is required (the reference's
// S3_BUCKET_NAME and S3_REGION are read when str's names are unset), the
// endpoint must be a URL, the path style one of three words.
func TestConfigS3(t *testing.T) {
	base := map[string]string{"SAM_NAMESPACE": "ns", "DEV_BROKER_HOST": "h", "ARTIFACT_SERVICE_TYPE": "s3"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	if _, err := LoadConfig(nil, envOf(with()), io.Discard); err == nil || !strings.Contains(err.Error(), "ARTIFACT_S3_BUCKET") {
		t.Fatalf("no bucket: %v", err)
	}
	c, err := LoadConfig(nil, envOf(with("S3_BUCKET_NAME", "b1", "S3_REGION", "eu-west-3", "S3_ENDPOINT_URL", "http://127.0.0.1:9000")), io.Discard)
	if err != nil || c.ArtifactS3Bucket != "b1" || c.ArtifactS3Region != "eu-west-3" || c.ArtifactS3Endpoint != "http://127.0.0.1:9000" || c.ArtifactS3PathStyle != "auto" {
		t.Fatalf("reference names: %+v, %v", c, err)
	}
	c, err = LoadConfig(nil, envOf(with("S3_BUCKET_NAME", "b1", "ARTIFACT_S3_BUCKET", "b2", "S3_REGION", "r1", "ARTIFACT_S3_REGION", "r2")), io.Discard)
	if err != nil || c.ArtifactS3Bucket != "b2" || c.ArtifactS3Region != "r2" {
		t.Fatalf("str's names first: %+v, %v", c, err)
	}
	for _, kv := range [][2]string{{"S3_ENDPOINT_URL", "127.0.0.1:9000"}, {"S3_ENDPOINT_URL", "ftp://h"}, {"ARTIFACT_S3_PATH_STYLE", "yes"}} {
		if _, err := LoadConfig(nil, envOf(with("ARTIFACT_S3_BUCKET", "b", kv[0], kv[1])), io.Discard); err == nil || !strings.Contains(err.Error(), kv[0]) {
			t.Errorf("%s=%s: %v", kv[0], kv[1], err)
		}
	}
}

// ARTIFACT_SERVICE_TYPE=gcs needs a bucket.
func TestConfigGCS(t *testing.T) {
	env := map[string]string{"SAM_NAMESPACE": "ns", "DEV_BROKER_HOST": "h", "ARTIFACT_SERVICE_TYPE": "gcs"}
	if _, err := LoadConfig(nil, envOf(env), io.Discard); err == nil || !strings.Contains(err.Error(), "ARTIFACT_GCS_BUCKET") {
		t.Fatalf("no bucket: %v", err)
	}
	env["ARTIFACT_GCS_BUCKET"], env["GCS_CREDENTIALS_JSON"] = "b", `{"type":"service_account"}`
	if c, err := LoadConfig(nil, envOf(env), io.Discard); err != nil || c.ArtifactGCSBuck != "b" || c.ArtifactGCSCredentials == "" {
		t.Fatalf("with a bucket: %+v, %v", c, err)
	}
}

func TestConfigFileUnknownKey(t *testing.T) {
	file := filepath.Join(t.TempDir(), "w.yaml")
	os.WriteFile(file, []byte("SAM_NAMESPACE: a\nSAM_NAMESPCE: b\n"), 0o600)
	_, err := LoadConfig([]string{"--config", file}, envOf(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), `unknown setting "SAM_NAMESPCE"`) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("got %v", err)
	}
}

func TestConfigHelp(t *testing.T) {
	var b strings.Builder
	_, err := LoadConfig([]string{"--help"}, envOf(nil), &b)
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(b.String(), "flags > environment > config file > defaults") ||
		!strings.Contains(b.String(), "SANDBOX_MAX_CONCURRENT, default 4") {
		t.Fatalf("help: %v\n%s", err, b.String())
	}
}

// TestConfigHealthAddr: health and metrics bind 127.0.0.1 unless
// HEALTH_ADDR says otherwise (before: every interface).
func TestConfigHealthAddr(t *testing.T) {
	base := map[string]string{"SAM_NAMESPACE": "demo/", "DEV_BROKER_HOST": "localhost"}
	c, err := LoadConfig(nil, envOf(base), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.HealthListenAddr(); got != "127.0.0.1:8081" {
		t.Fatalf("default health address %s, want 127.0.0.1:8081", got)
	}
	for addr, want := range map[string]string{"0.0.0.0": "0.0.0.0:8081", "::": "[::]:8081", "localhost": "localhost:8081"} {
		env := map[string]string{"HEALTH_ADDR": addr}
		for k, v := range base {
			env[k] = v
		}
		c, err := LoadConfig(nil, envOf(env), io.Discard)
		if err != nil || c.HealthListenAddr() != want {
			t.Errorf("HEALTH_ADDR=%s: %v %v", addr, c, err)
		}
	}
	for _, bad := range []string{"127.0.0.1:9000", "[::1]", "a b"} {
		_, err := LoadConfig([]string{"--health-addr", bad}, envOf(base), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "HEALTH_ADDR") {
			t.Errorf("HEALTH_ADDR=%q accepted: %v", bad, err)
		}
	}
}

// TestConfigRelativePaths: relative paths are resolved against the working
// directory at start-up (the sandbox binds need absolute, clean paths).
func TestConfigRelativePaths(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig([]string{"--tools-dir", "tools/python/", "--work-dir", "/abs/../work"},
		envOf(map[string]string{"SAM_NAMESPACE": "demo/", "DEV_BROKER_HOST": "localhost", "MANIFEST_PATH": "tools/manifest.yaml"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.ToolsDir != filepath.Join(wd, "tools/python") || c.toolsDirGiven != "tools/python/" ||
		c.ManifestPath != filepath.Join(wd, "tools/manifest.yaml") || c.WorkDir != "/work" {
		t.Fatalf("tools %s (given %s) manifest %s work %s", c.ToolsDir, c.toolsDirGiven, c.ManifestPath, c.WorkDir)
	}
}

func TestConfigSandboxMode(t *testing.T) {
	base := envOf(map[string]string{"SAM_NAMESPACE": "demo/", "DEV_BROKER_HOST": "localhost"})
	if c, err := LoadConfig(nil, base, io.Discard); err != nil || c.SandboxMode != ModeSandbox {
		t.Fatalf("default mode: %v %v", c, err)
	}
	if c, err := LoadConfig([]string{"--sandbox-mode", "none"}, base, io.Discard); err != nil || c.SandboxMode != ModeNone {
		t.Fatalf("none: %v %v", c, err)
	}
	if _, err := LoadConfig([]string{"--sandbox-mode", "direct"}, base, io.Discard); err == nil || !strings.Contains(err.Error(), "SANDBOX_MODE") {
		t.Fatalf("unknown mode accepted: %v", err)
	}
}

// The broker probe's settings: defaults on (10 s, 30 s), 0 turns it off,
// and an interval without a bound is refused.
func TestConfigBrokerProbe(t *testing.T) {
	base := map[string]string{"SAM_NAMESPACE": "demo/", "DEV_BROKER_HOST": "localhost"}
	c, err := LoadConfig(nil, envOf(base), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.ProbeInterval != 10*time.Second || c.ProbeTimeout != 30*time.Second {
		t.Fatalf("probe defaults %v %v", c.ProbeInterval, c.ProbeTimeout)
	}
	c, err = LoadConfig([]string{"--broker-probe-interval-ms", "0", "--broker-probe-timeout-ms", "0"}, envOf(base), io.Discard)
	if err != nil || c.ProbeInterval != 0 {
		t.Fatalf("probe off: %v %v", c, err)
	}
	_, err = LoadConfig([]string{"--broker-probe-timeout-ms", "0"}, envOf(base), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "STR_BROKER_PROBE_TIMEOUT_MS") {
		t.Fatalf("probe on without a bound accepted: %v", err)
	}
}

// TestConfigDevBrokerPool: DEV_BROKER_POOL_NAME makes the dev broker queue
// the pool's (a queue group shared by its workers); a name that is not one
// is refused, naming the setting.
func TestConfigDevBrokerPool(t *testing.T) {
	env := map[string]string{"SAM_NAMESPACE": "demo/", "DEV_BROKER_HOST": "localhost", "SAM_WORKER_ID": "w2", "DEV_BROKER_POOL_NAME": "fleet"}
	c, err := LoadConfig(nil, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.QueueName() != "demo/q/sandbox/pool/fleet" {
		t.Fatalf("queue %s, want the pool's", c.QueueName())
	}
	for _, bad := range []string{"a/b", ".."} {
		env["DEV_BROKER_POOL_NAME"] = bad
		if _, err := LoadConfig(nil, envOf(env), io.Discard); err == nil || !strings.Contains(err.Error(), "DEV_BROKER_POOL_NAME") {
			t.Fatalf("pool %q: %v", bad, err)
		}
	}
}

package solace_test

import (
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/worker/transport/solace"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestConfigDefaults(t *testing.T) {
	cfg, err := solace.ConfigFromEnv(envOf(map[string]string{"SOLACE_HOST": "broker:55555"}), "/acme/", "sandbox-worker-001")
	if err != nil {
		t.Fatal(err)
	}
	want := solace.Config{
		Host: "broker:55555", VPN: "default", ReconnectRetries: 10, ReconnectInterval: 3 * time.Second,
		Mode: "guaranteed", QueueName: "acme/q/sandbox/sandbox-worker-001", BackPressureBuffer: 64,
		MaxMessageBytes: solace.DefaultMaxMessageBytes,
	}
	if cfg != want {
		t.Errorf("defaults:\n got %+v\nwant %+v", cfg, want)
	}
}

func TestConfigAllVariables(t *testing.T) {
	env := map[string]string{
		"SOLACE_HOST": "tcps://broker.example:55443", "SOLACE_VPN": "prod", "SOLACE_USERNAME": "w",
		"SOLACE_TRUST_STORE_PATH": "/etc/ssl/certs", "SOLACE_CLIENT_CERT_PATH": "/c.pem", "SOLACE_CLIENT_KEY_PATH": "/k.pem",
		"SOLACE_RECONNECT_RETRIES": "-1", "SOLACE_RECONNECT_DELAY_MS": "250", "SOLACE_DELIVERY_MODE": "Guaranteed",
		"SOLACE_POOL_NAME": "gpu", "SOLACE_CLIENT_NAME": "str-w1", "SOLACE_RECEIVE_BUFFER": "8",
		"SOLACE_MAX_MESSAGE_BYTES": "30000000",
	}
	cfg, err := solace.ConfigFromEnv(envOf(env), "acme", "w1")
	if err != nil {
		t.Fatal(err)
	}
	want := solace.Config{
		Host: "tcps://broker.example:55443", VPN: "prod", Username: "w", TrustStorePath: "/etc/ssl/certs",
		ClientCertPath: "/c.pem", ClientKeyPath: "/k.pem", ReconnectRetries: -1, ReconnectInterval: 250 * time.Millisecond,
		Mode: "guaranteed", QueueName: "acme/q/sandbox/pool/gpu", PoolName: "gpu", ClientName: "str-w1", BackPressureBuffer: 8,
		MaxMessageBytes: 30_000_000,
	}
	if cfg != want {
		t.Errorf("\n got %+v\nwant %+v", cfg, want)
	}
	if _, err := solace.New(cfg, nil); err != nil {
		t.Errorf("New with a valid config: %v", err)
	}
}

func TestConfigDirectHasNoQueue(t *testing.T) {
	cfg, err := solace.ConfigFromEnv(envOf(map[string]string{"SOLACE_HOST": "h", "SOLACE_DELIVERY_MODE": "direct"}), "ns", "w")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QueueName != "" || cfg.Mode != solace.ModeDirect {
		t.Errorf("direct: %+v", cfg)
	}
}

// TestConfigCollectsAllProblems: every problem is reported at once.
func TestConfigCollectsAllProblems(t *testing.T) {
	env := map[string]string{
		"SOLACE_RECONNECT_RETRIES": "many", "SOLACE_RECONNECT_DELAY_MS": "0", "SOLACE_DELIVERY_MODE": "fast",
		"SOLACE_QUEUE_NAME": "q", "SOLACE_POOL_NAME": "a/b", "SOLACE_CLIENT_CERT_PATH": "/c.pem", "SOLACE_RECEIVE_BUFFER": "0",
		"SOLACE_MAX_MESSAGE_BYTES": "4096",
	}
	_, err := solace.ConfigFromEnv(envOf(env), "", "w")
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"SOLACE_RECONNECT_RETRIES=\"many\"", "SOLACE_RECONNECT_DELAY_MS=0", "SOLACE_DELIVERY_MODE=\"fast\"",
		"SAM_NAMESPACE is empty", "both set", "SOLACE_POOL_NAME=\"a/b\"", "SOLACE_HOST is empty",
		"must be set together", "needs TLS", "SOLACE_RECEIVE_BUFFER=0", "SOLACE_MAX_MESSAGE_BYTES=4096",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func TestConfigRejects(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"pool in direct mode":    {"SOLACE_HOST": "h", "SOLACE_DELIVERY_MODE": "direct", "SOLACE_POOL_NAME": "p"},
		"queue in direct mode":   {"SOLACE_HOST": "h", "SOLACE_DELIVERY_MODE": "direct", "SOLACE_QUEUE_NAME": "q"},
		"retries below -1":       {"SOLACE_HOST": "h", "SOLACE_RECONNECT_RETRIES": "-2"},
		"cert with password":     {"SOLACE_HOST": "tcps://h:1", "SOLACE_CLIENT_CERT_PATH": "c", "SOLACE_CLIENT_KEY_PATH": "k", "SOLACE_PASSWORD": "p"},
		"guaranteed, no queue":   {"SOLACE_HOST": "h"},
		"negative buffer":        {"SOLACE_HOST": "h", "SOLACE_RECEIVE_BUFFER": "-1"},
		"non-numeric delay":      {"SOLACE_HOST": "h", "SOLACE_RECONNECT_DELAY_MS": "3s"},
		"key without a cert set": {"SOLACE_HOST": "tcps://h:1", "SOLACE_CLIENT_KEY_PATH": "k"},
		"non-numeric max size":   {"SOLACE_HOST": "h", "SOLACE_MAX_MESSAGE_BYTES": "10MB"},
	} {
		worker := "w"
		if name == "guaranteed, no queue" {
			worker = ""
		}
		if _, err := solace.ConfigFromEnv(envOf(env), "ns", worker); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := solace.New(solace.Config{}, nil); err == nil {
		t.Error("New accepted an empty Config")
	}
}

func TestQueueNames(t *testing.T) {
	if got := solace.WorkerQueueName("/acme/prod/", "w-1"); got != "acme/prod/q/sandbox/w-1" {
		t.Errorf("WorkerQueueName = %q", got)
	}
	if got := solace.PoolQueueName("acme", "gpu"); got != "acme/q/sandbox/pool/gpu" {
		t.Errorf("PoolQueueName = %q", got)
	}
}

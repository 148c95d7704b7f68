package main

import "testing"

// TestDefaultBroker: --broker's default from DEV_BROKER_HOST and
// DEV_BROKER_PORT; the port alone used to be ignored.
func TestDefaultBroker(t *testing.T) {
	for _, c := range []struct{ host, port, want string }{
		{"", "", "127.0.0.1:55554"},
		{"", "6000", "127.0.0.1:6000"},
		{"broker.local", "", "broker.local:55555"},
		{"broker.local", "6000", "broker.local:6000"},
		{"::1", "6000", "[::1]:6000"},
	} {
		env := map[string]string{"DEV_BROKER_HOST": c.host, "DEV_BROKER_PORT": c.port}
		if got := defaultBroker(func(k string) string { return env[k] }); got != c.want {
			t.Errorf("host %q port %q: %s, want %s", c.host, c.port, got, c.want)
		}
	}
}

package solace

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Delivery modes (SOLACE_DELIVERY_MODE).
const (
	// ModeDirect subscribes the worker's session to the invoke topics.
	// Nothing is stored by the broker: a request published while the
	// worker is down, or dropped under back-pressure, is lost.
	ModeDirect = "direct"
	// ModeGuaranteed binds to a durable queue that holds the invoke topics
	// as queue subscriptions; a request is removed from the queue only when
	// the worker acknowledges it after publishing the reply.
	ModeGuaranteed = "guaranteed"
)

// Defaults of spec §12 and of the variables str adds.
const (
	DefaultVPN                = "default"
	DefaultReconnectRetries   = 10
	DefaultReconnectInterval  = 3000 * time.Millisecond
	DefaultMode               = ModeGuaranteed
	DefaultBackPressureBuffer = 64
	// DefaultMaxMessageBytes is a Solace queue's default max-msg-size
	// (10,000,000 bytes): an agent's reply queue takes no larger message
	// unless its administrator raised the limit.
	DefaultMaxMessageBytes = 10_000_000
)

// minMaxMessageBytes is the least SOLACE_MAX_MESSAGE_BYTES: a worker
// keeps 64 KiB of a message for the reply's envelope, and a limit below
// 1 MiB leaves tools next to nothing.
const minMaxMessageBytes = 1 << 20

// Config is everything the Solace transport needs. Build it with
// ConfigFromEnv or by hand; New validates it either way.
type Config struct {
	// Host is SOLACE_HOST: "host:port" or a URL (tcp://, tcps://). Tests
	// also use the C library's peer mode "listen:127.0.0.1:PORT" on the
	// other side of the connection.
	Host string
	// VPN is the message VPN (SOLACE_VPN, default "default").
	VPN string
	// Username and Password are for basic authentication
	// (SOLACE_USERNAME, SOLACE_PASSWORD). With a client certificate the
	// username, if set, is the client username to assert.
	Username, Password string
	// TrustStorePath is a directory of PEM CA certificates used to verify
	// the broker on tcps:// (SOLACE_TRUST_STORE_PATH).
	TrustStorePath string
	// ClientCertPath and ClientKeyPath select client-certificate
	// authentication (SOLACE_CLIENT_CERT_PATH, SOLACE_CLIENT_KEY_PATH);
	// it needs a tcps:// host.
	ClientCertPath, ClientKeyPath string
	// ReconnectRetries is how often the library retries after a drop
	// (SOLACE_RECONNECT_RETRIES, default 10; -1 = forever). When they run
	// out, the transport builds a new service and keeps trying every
	// ReconnectInterval until Close.
	ReconnectRetries int
	// ReconnectInterval is the wait between attempts, for the library's
	// reconnects and for str's own connect loop (SOLACE_RECONNECT_DELAY_MS,
	// default 3000).
	ReconnectInterval time.Duration
	// Mode is ModeDirect or ModeGuaranteed (SOLACE_DELIVERY_MODE, default
	// guaranteed).
	Mode string
	// QueueName is the durable queue of guaranteed mode
	// (SOLACE_QUEUE_NAME, default "{ns}/q/sandbox/{worker_id}", or
	// "{ns}/q/sandbox/pool/{pool}" when PoolName is set).
	QueueName string
	// PoolName (SOLACE_POOL_NAME) makes the queue a shared, non-exclusive
	// queue that every worker of the pool binds to, so that each request
	// is delivered to one worker only. The queue must be provisioned by an
	// administrator (see docs/solace.md): a queue created by a client would
	// be exclusive, so the transport never creates a pool queue.
	PoolName string
	// ClientName is the session's client name (SOLACE_CLIENT_NAME). Empty
	// lets the library generate a unique one; two sessions with the same
	// name cannot be connected to one VPN at once.
	ClientName string
	// BackPressureBuffer is the number of received messages the library
	// holds for the worker before it applies back-pressure
	// (SOLACE_RECEIVE_BUFFER, default 64). Direct mode drops the newest
	// message when the buffer is full (the broker cannot be slowed down
	// for direct messages; a dropped request is logged and counted);
	// guaranteed mode never drops: the broker stops sending when the
	// flow's window is full and the message stays on the queue.
	BackPressureBuffer int
	// MaxMessageBytes is the largest message the worker publishes
	// (SOLACE_MAX_MESSAGE_BYTES, default 10,000,000, a queue's default
	// max-msg-size): payload, topic and user properties. A larger one is
	// refused before it is sent, and the worker sizes its replies to it.
	// 0 means DefaultMaxMessageBytes.
	MaxMessageBytes int
}

// ConfigFromEnv reads the SOLACE_* variables of spec §12 (and the ones str
// adds: SOLACE_DELIVERY_MODE, SOLACE_QUEUE_NAME, SOLACE_POOL_NAME,
// SOLACE_CLIENT_NAME, SOLACE_RECEIVE_BUFFER, SOLACE_MAX_MESSAGE_BYTES)
// through getenv. namespace and
// workerID name the default queue. Every problem is reported, joined.
func ConfigFromEnv(getenv func(string) string, namespace, workerID string) (Config, error) {
	var problems []error
	cfg := Config{
		Host:               strings.TrimSpace(getenv("SOLACE_HOST")),
		VPN:                getenv("SOLACE_VPN"),
		Username:           getenv("SOLACE_USERNAME"),
		Password:           getenv("SOLACE_PASSWORD"),
		TrustStorePath:     getenv("SOLACE_TRUST_STORE_PATH"),
		ClientCertPath:     getenv("SOLACE_CLIENT_CERT_PATH"),
		ClientKeyPath:      getenv("SOLACE_CLIENT_KEY_PATH"),
		ReconnectRetries:   DefaultReconnectRetries,
		ReconnectInterval:  DefaultReconnectInterval,
		Mode:               strings.ToLower(strings.TrimSpace(getenv("SOLACE_DELIVERY_MODE"))),
		QueueName:          getenv("SOLACE_QUEUE_NAME"),
		PoolName:           getenv("SOLACE_POOL_NAME"),
		ClientName:         getenv("SOLACE_CLIENT_NAME"),
		BackPressureBuffer: DefaultBackPressureBuffer,
		MaxMessageBytes:    DefaultMaxMessageBytes,
	}
	if cfg.VPN == "" {
		cfg.VPN = DefaultVPN
	}
	if cfg.Mode == "" {
		cfg.Mode = DefaultMode
	}
	if v := getenv("SOLACE_RECONNECT_RETRIES"); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			problems = append(problems, fmt.Errorf("SOLACE_RECONNECT_RETRIES=%q: not an integer", v))
		} else {
			cfg.ReconnectRetries = n
		}
	}
	if v := getenv("SOLACE_RECONNECT_DELAY_MS"); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			problems = append(problems, fmt.Errorf("SOLACE_RECONNECT_DELAY_MS=%q: not an integer", v))
		} else {
			cfg.ReconnectInterval = time.Duration(n) * time.Millisecond
		}
	}
	if v := getenv("SOLACE_RECEIVE_BUFFER"); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			problems = append(problems, fmt.Errorf("SOLACE_RECEIVE_BUFFER=%q: not an integer", v))
		} else {
			cfg.BackPressureBuffer = n
		}
	}
	if v := getenv("SOLACE_MAX_MESSAGE_BYTES"); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			problems = append(problems, fmt.Errorf("SOLACE_MAX_MESSAGE_BYTES=%q: not an integer", v))
		} else {
			cfg.MaxMessageBytes = n
		}
	}
	ns := strings.Trim(namespace, "/")
	if ns == "" {
		problems = append(problems, errors.New("SAM_NAMESPACE is empty: the queue and topic names need it"))
	}
	if cfg.QueueName != "" && cfg.PoolName != "" {
		problems = append(problems, fmt.Errorf("SOLACE_QUEUE_NAME=%q and SOLACE_POOL_NAME=%q are both set: set only one (the pool name derives the shared queue %q)",
			cfg.QueueName, cfg.PoolName, PoolQueueName(ns, cfg.PoolName)))
	}
	if cfg.QueueName == "" && cfg.Mode == ModeGuaranteed {
		if cfg.PoolName != "" {
			cfg.QueueName = PoolQueueName(ns, cfg.PoolName)
		} else if workerID != "" {
			cfg.QueueName = WorkerQueueName(ns, workerID)
		}
	}
	if err := cfg.Validate(); err != nil {
		problems = append(problems, err)
	}
	return cfg, errors.Join(problems...)
}

// WorkerQueueName is the reference's per-worker queue name (spec §1):
// "{namespace without surrounding slashes}/q/sandbox/{worker_id}".
func WorkerQueueName(namespace, workerID string) string {
	return strings.Trim(namespace, "/") + "/q/sandbox/" + workerID
}

// PoolQueueName is the queue shared by the workers of one pool:
// "{namespace}/q/sandbox/pool/{pool}".
func PoolQueueName(namespace, pool string) string {
	return strings.Trim(namespace, "/") + "/q/sandbox/pool/" + pool
}

// Validate reports every problem of c, joined; nil when c is usable.
func (c Config) Validate() error {
	var problems []error
	add := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	if c.Host == "" {
		add("SOLACE_HOST is empty: give host:port or a URL such as tcps://broker.example:55443")
	}
	if c.VPN == "" {
		add("SOLACE_VPN is empty")
	}
	switch c.Mode {
	case ModeDirect:
		if c.PoolName != "" {
			add("SOLACE_POOL_NAME=%q needs SOLACE_DELIVERY_MODE=guaranteed: in direct mode every worker subscribed to a topic gets its own copy of each request", c.PoolName)
		}
		if c.QueueName != "" {
			add("SOLACE_QUEUE_NAME=%q is only used in guaranteed mode, but SOLACE_DELIVERY_MODE=direct", c.QueueName)
		}
	case ModeGuaranteed:
		if c.QueueName == "" {
			add("guaranteed mode needs a queue: set SOLACE_QUEUE_NAME, SOLACE_POOL_NAME or SAM_WORKER_ID")
		}
	default:
		add("SOLACE_DELIVERY_MODE=%q: must be %q or %q", c.Mode, ModeDirect, ModeGuaranteed)
	}
	if strings.ContainsAny(c.PoolName, "/*> ") {
		add("SOLACE_POOL_NAME=%q: must not contain '/', '*', '>' or spaces", c.PoolName)
	}
	if c.ReconnectRetries < -1 {
		add("SOLACE_RECONNECT_RETRIES=%d: must be -1 (forever), 0 or more", c.ReconnectRetries)
	}
	if c.ReconnectInterval <= 0 {
		add("SOLACE_RECONNECT_DELAY_MS=%d: must be more than 0", c.ReconnectInterval.Milliseconds())
	}
	if c.BackPressureBuffer < 1 {
		add("SOLACE_RECEIVE_BUFFER=%d: must be at least 1", c.BackPressureBuffer)
	}
	if c.MaxMessageBytes != 0 && c.MaxMessageBytes < minMaxMessageBytes {
		add("SOLACE_MAX_MESSAGE_BYTES=%d: must be at least %d (a reply needs room for its envelope)", c.MaxMessageBytes, minMaxMessageBytes)
	}
	if (c.ClientCertPath == "") != (c.ClientKeyPath == "") {
		add("SOLACE_CLIENT_CERT_PATH and SOLACE_CLIENT_KEY_PATH must be set together (got cert %q, key %q)", c.ClientCertPath, c.ClientKeyPath)
	}
	if c.ClientCertPath != "" && !c.tls() {
		add("client-certificate authentication needs TLS: SOLACE_HOST=%q must start with tcps://", c.Host)
	}
	if c.ClientCertPath != "" && c.Password != "" {
		add("SOLACE_PASSWORD is set together with a client certificate: choose one authentication scheme")
	}
	return errors.Join(problems...)
}

// tls reports whether the host asks for a TLS connection.
func (c Config) tls() bool {
	return strings.HasPrefix(strings.ToLower(c.Host), "tcps://")
}

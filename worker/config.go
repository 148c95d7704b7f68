package worker

import (
	"bytes"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/manifest"
)

// Config is the worker's configuration. Every setting has one name, used
// verbatim as the environment variable and as the key in the YAML file
// (--config), and a flag. Precedence, highest first:
//
//	flags > environment > config file > defaults
//
// An environment variable set to the empty string counts as unset.
type Config struct {
	Namespace         string        // SAM_NAMESPACE (required)
	WorkerID          string        // SAM_WORKER_ID
	ManifestPath      string        // MANIFEST_PATH
	ToolsDir          string        // TOOLS_PYTHON_DIR
	DefaultTimeout    time.Duration // DEFAULT_TIMEOUT_SECONDS
	DevBrokerHost     string        // DEV_BROKER_HOST (selects dev mode)
	DevBrokerPort     int           // DEV_BROKER_PORT
	DevBrokerPool     string        // DEV_BROKER_POOL_NAME: the queue group shared with the pool's other workers
	ConnectRetries    int           // CONNECT_RETRIES (0 = forever)
	ConnectRetryDelay time.Duration // CONNECT_RETRY_DELAY_MS
	EmbeddedBroker    string        // STR_EMBEDDED_BROKER: host:port of an in-process dev broker

	SolaceHost           string // SOLACE_HOST (selects Solace)
	SolaceVPN            string
	SolaceUsername       string
	SolacePassword       string
	SolaceTrustStorePath string
	SolaceClientCertPath string
	SolaceClientKeyPath  string
	SolaceReconnectTries int
	SolaceReconnectDelay time.Duration

	SandboxMode    SandboxMode // SANDBOX_MODE
	PythonBin      string      // SANDBOX_PYTHON_BIN
	WorkDir        string      // SANDBOX_WORK_DIR
	DefaultProfile string      // SANDBOX_DEFAULT_PROFILE
	MaxConcurrent  int         // SANDBOX_MAX_CONCURRENT
	MaxQueued      int         // SANDBOX_MAX_QUEUED
	ProfileDir     string      // SANDBOX_PROFILE_DIR: extra profile files
	CgroupParent   string      // SANDBOX_CGROUP_PARENT
	RunnerDir      string      // STR_RUNNER_DIR
	SiteDir        string      // STR_SITE_DIR
	PackageIndex   string      // STR_PACKAGE_INDEX_URL
	// PackageHosts (STR_PACKAGE_HOSTS) are more hosts, on port 443, the
	// index's files come from (pypi.org serves them from
	// files.pythonhosted.org); the installation sandbox reaches only the
	// index and these.
	PackageHosts []string
	// PackageBuilds (STR_PACKAGE_ALLOW_BUILDS): pip may build source
	// distributions, whose build code then runs in the installation
	// sandbox; default false: wheels only.
	PackageBuilds bool

	ArtifactType     string // ARTIFACT_SERVICE_TYPE
	ArtifactBasePath string // ARTIFACT_BASE_PATH
	// The S3 store (ARTIFACT_SERVICE_TYPE=s3); credentials come from the
	// AWS chain (artifacts.NewS3).
	ArtifactS3Bucket    string // ARTIFACT_S3_BUCKET, else S3_BUCKET_NAME
	ArtifactS3Region    string // ARTIFACT_S3_REGION, else S3_REGION
	ArtifactS3Endpoint  string // S3_ENDPOINT_URL
	ArtifactS3PathStyle string // ARTIFACT_S3_PATH_STYLE
	// The GCS store (ARTIFACT_SERVICE_TYPE=gcs): Application Default
	// Credentials unless GCS_CREDENTIALS_JSON gives a service account key.
	ArtifactGCSBuck        string // ARTIFACT_GCS_BUCKET
	ArtifactGCSCredentials string // GCS_CREDENTIALS_JSON
	// ARTIFACT_AUDIT_LOG: audit log path ("" = the store's default, "off").
	ArtifactAuditLog       string
	ArtifactMemoryMaxBytes int64 // ARTIFACT_MEMORY_MAX_BYTES: the memory store's LRU budget

	HealthAddr string // HEALTH_ADDR: the address the health server binds (default 127.0.0.1)
	HealthPort int    // HEALTH_PORT (0 = no health server)

	MaxPayloadBytes int           // STR_MAX_PAYLOAD_BYTES
	MaxOutputBytes  int64         // STR_MAX_OUTPUT_BYTES: all outputs of one run
	ShutdownGrace   time.Duration // SHUTDOWN_GRACE_SECONDS
	SigningSecret   string        // STR_SIGNING_SECRET: HMAC-SHA256 request signing when set
	// Identity modes besides the shared secret (auth.go).
	SigningKeys          string        // STR_SIGNING_KEYS: keys file of per-agent signing keys
	UserTokenKeys        string        // STR_USER_TOKEN_KEYS: issuer keys (JWK Set or PEM) of user tokens
	UserTokenAudience    string        // STR_USER_TOKEN_AUDIENCE: required with STR_USER_TOKEN_KEYS
	UserTokenIssuer      string        // STR_USER_TOKEN_ISSUER: "" = any issuer the keys verify
	UserTokenClaim       string        // STR_USER_TOKEN_CLAIM: the claim equal to params.user_id
	UserTokenMaxLifetime time.Duration // STR_USER_TOKEN_MAX_LIFETIME_SECONDS: exp − iat (exp − now without iat) at most
	RatePerMinute        float64       // STR_USER_RATE_PER_MINUTE (0 = off)
	RateBurst            int           // STR_USER_RATE_BURST
	ReloadInterval       time.Duration // STR_MANIFEST_POLL_MS
	LogLevel             string        // STR_LOG_LEVEL

	// The broker liveness probe (probe.go).
	ProbeInterval time.Duration // STR_BROKER_PROBE_INTERVAL_MS (0 = off)
	ProbeTimeout  time.Duration // STR_BROKER_PROBE_TIMEOUT_MS

	// Fair shares and artifact quotas (sched.go, artifacts/quota.go),
	// per requester (task.who.key()), per agent key (task.who.Key) and
	// per store user (params.user_id).
	UserMaxRunning int             // STR_USER_MAX_RUNNING: one requester's running calls (-1 = auto: userMaxRunning)
	UserMaxQueued  int             // STR_USER_MAX_QUEUED: one requester's waiting calls (-1 = auto: userMaxQueued)
	KeyMaxRunning  int             // STR_KEY_MAX_RUNNING: one agent key's running calls, all its users together (-1 = auto: keyMaxRunning)
	KeyMaxQueued   int             // STR_KEY_MAX_QUEUED: one agent key's waiting calls (-1 = auto: keyMaxQueued)
	ArtifactQuota  artifacts.Quota // ARTIFACT_{USER,SESSION}_MAX_{BYTES,VERSIONS} (0 = no limit)

	// The warm pool (pool.go).
	WarmDefault int           // STR_WARM_DEFAULT: pool size of a tool whose manifest entry has no warm
	WarmMemory  int64         // STR_WARM_MEMORY: bytes; each pooled sandbox counts at its profile's memory limit
	WarmMaxAge  time.Duration // STR_WARM_MAX_AGE_SECONDS: an idle pooled sandbox older than this is recycled

	// Per-tool templates (template.go).
	TemplateStartTimeout time.Duration // STR_TEMPLATE_START_TIMEOUT_SECONDS: a template's import and "ready" within this, else its start failed

	// Exposure of what the tools and the worker show (issue 16 §6).
	// ActiveMimeTypes (ARTIFACT_ACTIVE_MIME_TYPES): what a tool-chosen
	// active mime type (artifacts.IsActiveMimeType: HTML, SVG, XML,
	// JavaScript) becomes: "fallback" (default) stores the extension's
	// type instead, "keep" stores it and reports it in the reply.
	ActiveMimeTypes string
	// MetricsAddr (METRICS_ADDR): host:port of a listener of its own for
	// /metrics; "" serves it on the health server.
	MetricsAddr string
	// MetricsToken (METRICS_TOKEN): when set, /metrics answers only a
	// request with "Authorization: Bearer <token>".
	MetricsToken string
	// HealthDetail (HEALTH_DETAIL): "auto" (default) gives /healthz and
	// /readyz their detail (tool reasons, paths) only on a loopback
	// HEALTH_ADDR; "full" always; "minimal" never.
	HealthDetail string

	// toolsDirGiven is TOOLS_PYTHON_DIR as configured, before a relative
	// path was resolved (for the start-up check's hints).
	toolsDirGiven string
}

// SandboxMode says how tools are run (SANDBOX_MODE).
type SandboxMode string

const (
	// ModeSandbox runs every call in a fresh sandbox of the launcher. The
	// worker refuses to start when a probe sandbox cannot be created.
	ModeSandbox SandboxMode = "sandbox"
	// ModeNone runs every call as a plain child process of the worker,
	// without any isolation, as the reference's "direct" mode does. Only
	// an explicit SANDBOX_MODE=none selects it; the worker warns at
	// start-up and on every call's log lines.
	ModeNone SandboxMode = "none"
)

// relativePathSettings are the path settings resolved against the working
// directory at start-up when they are relative: the sandbox binds need
// absolute, clean paths, and a path must not change meaning later.
var relativePathSettings = []string{
	"MANIFEST_PATH", "TOOLS_PYTHON_DIR", "SANDBOX_WORK_DIR", "STR_RUNNER_DIR", "STR_SITE_DIR",
	"SANDBOX_PROFILE_DIR", "ARTIFACT_BASE_PATH", "STR_SIGNING_KEYS", "STR_USER_TOKEN_KEYS",
}

// setting is one configuration entry: name (env var and file key), flag,
// default and help.
type setting struct {
	name, flag, def, help string
	secret                bool
}

var settings = []setting{
	{name: "SAM_NAMESPACE", flag: "namespace", help: "topic namespace (required), e.g. demo/"},
	{name: "SAM_WORKER_ID", flag: "worker-id", def: "sandbox-worker-001", help: "worker id (Solace queue name and client id)"},
	{name: "MANIFEST_PATH", flag: "manifest", def: "/tools/manifest.yaml", help: "tool manifest"},
	{name: "TOOLS_PYTHON_DIR", flag: "tools-dir", def: "/tools/python", help: "directory of the tools' Python modules (read-only in sandboxes; a relative path is resolved against the working directory at start-up)"},
	{name: "DEFAULT_TIMEOUT_SECONDS", flag: "default-timeout", def: "300", help: "timeout when a request names none"},
	{name: "DEV_BROKER_HOST", flag: "dev-broker-host", help: "dev broker host (selects dev mode)"},
	{name: "DEV_BROKER_PORT", flag: "dev-broker-port", def: "55555", help: "dev broker port"},
	{name: "DEV_BROKER_POOL_NAME", flag: "dev-broker-pool", help: "on the dev broker, share the queue {ns}/q/sandbox/pool/{pool} with every worker of the pool: each request goes to one of them (default: the worker's own queue, {ns}/q/sandbox/{worker_id})"},
	{name: "CONNECT_RETRIES", flag: "connect-retries", def: "0", help: "dev broker connection attempts (0 = forever)"},
	{name: "CONNECT_RETRY_DELAY_MS", flag: "connect-retry-delay-ms", def: "3000", help: "delay between dev broker connection attempts"},
	{name: "STR_EMBEDDED_BROKER", flag: "embedded-broker", help: "start a dev broker in this process on ADDR (host:port) and connect to it"},
	{name: "SOLACE_HOST", flag: "solace-host", help: "Solace broker (host:port or URL; selects Solace)"},
	{name: "SOLACE_VPN", flag: "solace-vpn", def: "default", help: "Solace message VPN"},
	{name: "SOLACE_USERNAME", flag: "solace-username", help: "Solace user"},
	{name: "SOLACE_PASSWORD", flag: "solace-password", help: "Solace password", secret: true},
	{name: "SOLACE_TRUST_STORE_PATH", flag: "solace-trust-store", help: "CA directory for TLS"},
	{name: "SOLACE_CLIENT_CERT_PATH", flag: "solace-client-cert", help: "client certificate"},
	{name: "SOLACE_CLIENT_KEY_PATH", flag: "solace-client-key", help: "client key"},
	{name: "SOLACE_RECONNECT_RETRIES", flag: "solace-reconnect-retries", def: "10", help: "Solace reconnection attempts (-1 = forever)"},
	{name: "SOLACE_RECONNECT_DELAY_MS", flag: "solace-reconnect-delay-ms", def: "3000", help: "Solace reconnection interval"},
	{name: "SANDBOX_MODE", flag: "sandbox-mode", def: "sandbox", help: "sandbox | none: none runs tools as plain processes of the worker WITHOUT ANY ISOLATION (only for trusted tools on a host that cannot create sandboxes)"},
	{name: "SANDBOX_PYTHON_BIN", flag: "python", def: "/usr/bin/python3", help: "Python interpreter used inside sandboxes"},
	{name: "SANDBOX_WORK_DIR", flag: "work-dir", def: "/sandbox/work", help: "base of the per-task work dirs (stale entries are removed at startup)"},
	{name: "SANDBOX_DEFAULT_PROFILE", flag: "default-profile", def: "standard", help: "profile when neither manifest nor request names one"},
	{name: "SANDBOX_MAX_CONCURRENT", flag: "max-concurrent", def: "4", help: "executions running at once"},
	{name: "SANDBOX_MAX_QUEUED", flag: "max-queued", def: "256", help: "executions waiting; beyond this RESOURCE_EXHAUSTED"},
	{name: "SANDBOX_PROFILE_DIR", flag: "profile-dir", help: "directory of extra profile files"},
	{name: "SANDBOX_CGROUP_PARENT", flag: "cgroup-parent", help: "cgroup under which sandboxes are created"},
	{name: "STR_RUNNER_DIR", flag: "runner-dir", def: "/sandbox/runner", help: "where the embedded tool runner is installed (read-only in sandboxes)"},
	{name: "STR_SITE_DIR", flag: "site-dir", def: "/sandbox/site", help: "worker-owned base of the manifest packages' site dirs, one per distribution (<name>-<version>/, read-only in the sandboxes of the tools that declare it)"},
	{name: "STR_PACKAGE_INDEX_URL", flag: "package-index", help: "package index for manifest packages (default: offline, <manifest dir>/wheels); pip runs in a sandbox that reaches only this host and port"},
	{name: "STR_PACKAGE_HOSTS", flag: "package-hosts", help: "comma-separated extra hosts (port 443) the index's files come from, e.g. files.pythonhosted.org for pypi.org"},
	{name: "STR_PACKAGE_ALLOW_BUILDS", flag: "package-allow-builds", def: "false", help: "true lets pip build source distributions (their build code runs in the installation sandbox); default: wheels only"},
	{name: "ARTIFACT_SERVICE_TYPE", flag: "artifact-type", def: "memory", help: "memory | filesystem | s3 | gcs"},
	{name: "ARTIFACT_BASE_PATH", flag: "artifact-base-path", def: "/sam/artifacts", help: "filesystem artifact store base"},
	{name: "ARTIFACT_S3_BUCKET", flag: "artifact-s3-bucket", help: "bucket of the s3 store (required with ARTIFACT_SERVICE_TYPE=s3); credentials come from the standard AWS chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE and the shared files, web identity, ECS or EC2 roles), never passed to sandboxes"},
	{name: "S3_BUCKET_NAME", flag: "s3-bucket-name", help: "the reference's examples' name of ARTIFACT_S3_BUCKET, read when that is unset"},
	{name: "ARTIFACT_S3_REGION", flag: "artifact-s3-region", help: "region of the s3 store (default: S3_REGION, else the AWS chain's AWS_REGION, AWS_DEFAULT_REGION or profile, else us-east-1)"},
	{name: "S3_REGION", flag: "s3-region", help: "the reference's examples' name of ARTIFACT_S3_REGION, read when that is unset"},
	{name: "S3_ENDPOINT_URL", flag: "s3-endpoint-url", help: "URL of an S3-compatible store (MinIO, Ceph, SeaweedFS, versitygw), the reference's name; unset: AWS S3 in the region"},
	{name: "ARTIFACT_S3_PATH_STYLE", flag: "artifact-s3-path-style", def: "auto", help: "auto | true | false: the bucket in the URL's path (true) or host name (false); auto: path style exactly when S3_ENDPOINT_URL is set"},
	{name: "ARTIFACT_GCS_BUCKET", flag: "artifact-gcs-bucket", help: "bucket of the gcs store (required with ARTIFACT_SERVICE_TYPE=gcs); credentials: Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, the metadata server, workload identity) unless GCS_CREDENTIALS_JSON is set, never passed to sandboxes; STORAGE_EMULATOR_HOST points the client at an emulator"},
	{name: "GCS_CREDENTIALS_JSON", flag: "gcs-credentials-json", help: "a service account key (JSON) for the gcs store, in place of Application Default Credentials (the reference's name)", secret: true},
	{name: "ARTIFACT_AUDIT_LOG", flag: "artifact-audit-log", help: "append-only JSON-lines audit log of artifact saves and loads (default for the filesystem store: <ARTIFACT_BASE_PATH>/.audit/audit.jsonl; memory store: none; \"off\" = none)"},
	{name: "ARTIFACT_MEMORY_MAX_BYTES", flag: "artifact-memory-max-bytes", def: "268435456", help: "byte budget of the memory store: least recently used versions are evicted beyond it"},
	{name: "HEALTH_ADDR", flag: "health-addr", def: "127.0.0.1", help: "address /healthz, /readyz and /metrics listen on (0.0.0.0 or :: for every interface)"},
	{name: "HEALTH_PORT", flag: "health-port", def: "8081", help: "port of /healthz, /readyz and /metrics (0 = off)"},
	{name: "STR_MAX_PAYLOAD_BYTES", flag: "max-payload-bytes", def: "10485760", help: "largest accepted invoke payload"},
	{name: "STR_MAX_OUTPUT_BYTES", flag: "max-output-bytes", def: "104857600", help: "largest total size of one run's output artifacts"},
	{name: "SHUTDOWN_GRACE_SECONDS", flag: "shutdown-grace", def: "30", help: "on SIGTERM, how long running tools may finish"},
	{name: "STR_SIGNING_SECRET", flag: "signing-secret", help: "require signed requests (str-sign-v2: user properties \"timestamp\" and \"signature\", HMAC-SHA256 over the payload, topic, replyTo, statusTo, clientId, userId and timestamp; replays refused; see docs/protocol.md)", secret: true},
	{name: "STR_SIGNING_KEYS", flag: "signing-keys", help: "keys file of per-agent signing keys (str-sign-v3: key id in the \"keyId\" user property; each key may claim only its apps, users and tools); reloaded on change; see docs/deployment.md"},
	{name: "STR_USER_TOKEN_KEYS", flag: "user-token-keys", help: "require a user token (JWT in the \"authToken\" user property) verified against these issuer keys (a JWK Set or PEM public keys); reloaded on change"},
	{name: "STR_USER_TOKEN_AUDIENCE", flag: "user-token-audience", help: "audience a user token must name (required with STR_USER_TOKEN_KEYS)"},
	{name: "STR_USER_TOKEN_ISSUER", flag: "user-token-issuer", help: "issuer (iss) a user token must name (default: any the keys verify)"},
	{name: "STR_USER_TOKEN_CLAIM", flag: "user-token-claim", def: "sub", help: "the user token's claim that must equal params.user_id"},
	{name: "STR_USER_TOKEN_MAX_LIFETIME_SECONDS", flag: "user-token-max-lifetime", def: "86400", help: "the longest a user token may be valid, exp - iat (exp - now when it has no iat, with a minute's leeway); a longer-lived token is refused (AUTHENTICATION_FAILED): the worker cannot revoke a token, so this bounds how long a leaked one works. The default, one day, is what common issuers give at most (access tokens of an hour, some a day)"},
	{name: "STR_USER_RATE_PER_MINUTE", flag: "user-rate-per-minute", def: "0", help: "per-user invocation rate (token bucket; 0 = off)"},
	{name: "STR_USER_RATE_BURST", flag: "user-rate-burst", def: "0", help: "per-user burst (0 = one minute's rate)"},
	{name: "STR_MANIFEST_POLL_MS", flag: "manifest-poll-ms", def: "500", help: "manifest reload poll interval"},
	{name: "STR_LOG_LEVEL", flag: "log-level", def: "info", help: "debug | info | warn | error"},
	{name: "STR_BROKER_PROBE_INTERVAL_MS", flag: "broker-probe-interval-ms", def: "10000", help: "how often the worker sends itself a probe message through its own subscription, to detect a session that looks connected but no longer delivers (0 = off)"},
	{name: "STR_BROKER_PROBE_TIMEOUT_MS", flag: "broker-probe-timeout-ms", def: "30000", help: "a probe not back within this long makes /readyz say broker \"deaf\" and the worker re-establish its broker session"},
	{name: "STR_USER_MAX_RUNNING", flag: "user-max-running", def: "auto", help: "calls one requester (user, verified or not) may have running at once; auto = SANDBOX_MAX_CONCURRENT - 1 (at least 1), so one requester never takes the whole worker; at most SANDBOX_MAX_CONCURRENT"},
	{name: "STR_USER_MAX_QUEUED", flag: "user-max-queued", def: "auto", help: "calls one requester may have waiting for a slot; auto = SANDBOX_MAX_QUEUED / 4 (at least 1); beyond it that requester's calls are RESOURCE_EXHAUSTED"},
	{name: "STR_KEY_MAX_RUNNING", flag: "key-max-running", def: "auto", help: "calls the users of one agent key (STR_SIGNING_KEYS) may have running at once, all together, besides each user's own cap; auto = SANDBOX_MAX_CONCURRENT - 1 (at least 1), so one key never takes the whole worker with made-up users; at most SANDBOX_MAX_CONCURRENT (set it so when one agent serves every user)"},
	{name: "STR_KEY_MAX_QUEUED", flag: "key-max-queued", def: "auto", help: "calls the users of one agent key may have waiting for a slot, all together; auto = SANDBOX_MAX_QUEUED / 4 (at least 1); beyond it that key's calls are RESOURCE_EXHAUSTED"},
	{name: "ARTIFACT_USER_MAX_BYTES", flag: "artifact-user-max-bytes", def: "0", help: "artifact quota of one store user (params.user_id; the verified one with identity verification on): bytes over all their versions, every session and user: scope (e.g. 1Gi; 0 = no quota)"},
	{name: "ARTIFACT_USER_MAX_VERSIONS", flag: "artifact-user-max-versions", def: "0", help: "artifact quota of one store user: versions stored (0 = no quota)"},
	{name: "ARTIFACT_SESSION_MAX_BYTES", flag: "artifact-session-max-bytes", def: "0", help: "artifact quota of one session of a user: bytes over all its versions (0 = no quota)"},
	{name: "ARTIFACT_SESSION_MAX_VERSIONS", flag: "artifact-session-max-versions", def: "0", help: "artifact quota of one session of a user: versions stored (0 = no quota)"},
	{name: "ARTIFACT_ACTIVE_MIME_TYPES", flag: "artifact-active-mime-types", def: "fallback", help: "a mime type a tool chose that a viewer may run code from (HTML, XHTML, SVG, XML, JavaScript): fallback stores the file extension's type instead (application/octet-stream when it has none); keep stores it and lists it in the reply's notes"},
	{name: "METRICS_ADDR", flag: "metrics-addr", help: "host:port of a separate listener for /metrics (default: /metrics is served on HEALTH_ADDR:HEALTH_PORT)"},
	{name: "METRICS_TOKEN", flag: "metrics-token", help: "when set, /metrics requires \"Authorization: Bearer <token>\"", secret: true},
	{name: "HEALTH_DETAIL", flag: "health-detail", def: "auto", help: "auto | full | minimal: whether /healthz and /readyz name tools, reasons and paths; auto = only when HEALTH_ADDR is a loopback address"},
	{name: "STR_WARM_DEFAULT", flag: "warm-default", def: "0", help: "pre-started sandboxes per tool when its manifest entry has no warm: N (0..16)"},
	{name: "STR_WARM_MEMORY", flag: "warm-memory", def: "4Gi", help: "memory budget of the warm pool (e.g. 4Gi): each pooled sandbox counts at its profile's cgroup memory limit, the most it may use; 0 = no pool"},
	{name: "STR_WARM_MAX_AGE_SECONDS", flag: "warm-max-age", def: "120", help: "a pooled sandbox unused for this long is replaced by a fresh one"},
	{name: "STR_TEMPLATE_START_TIMEOUT_SECONDS", flag: "template-start-timeout", def: "60", help: "a warm: template tool's template that has not imported the tool and said ready within this long failed to start (retried with back-off); calls never wait for a template: they run cold meanwhile"},
}

// ConfigUsage is printed by `str worker --help`.
const ConfigUsage = `usage: str worker [flags]

Serves tool invocations from a broker (spec: docs of package worker).
Every setting has an environment variable (same name as the key of the
optional YAML file given with --config) and a flag. Precedence, highest
first: flags > environment > config file > defaults. An environment
variable set to "" counts as unset. The broker is chosen by SOLACE_HOST,
else --embedded-broker (a dev broker in this process), else DEV_BROKER_HOST.

Two launcher settings are environment variables only, shared by every str
command (worker, run, doctor, broker) so that they agree on them:
  STR_STATE_DIR  run-time state: id leases, cgroup locks, the dev broker's
                 token (default /run/str as root; under a read-only root,
                 a writable volume)
  STR_ID_RANGE   root mode: the sandboxes' ids, START:COUNT, inside this
                 process's uid/gid map (str doctor prints one that fits)

`

// LoadConfig builds the configuration from args (flags), getenv and the
// YAML file named by --config (or STR_CONFIG). Every problem is reported.
// flag.ErrHelp is returned after printing the usage for -h/--help.
func LoadConfig(args []string, getenv func(string) string, out io.Writer) (*Config, error) {
	// 1. flags.
	fs := flag.NewFlagSet("str worker", flag.ContinueOnError)
	fs.SetOutput(out)
	flagVals := map[string]*string{}
	for _, s := range settings {
		help := s.help + " [" + s.name
		if s.def != "" {
			help += ", default " + s.def
		}
		help += "]"
		flagVals[s.name] = fs.String(s.flag, "", help)
	}
	configPath := fs.String("config", "", "YAML file of settings (keys are the environment variable names) [STR_CONFIG]")
	fs.Usage = func() {
		fmt.Fprint(out, ConfigUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("str worker: unexpected arguments %q", fs.Args())
	}
	setFlags := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { setFlags[f.Name] = true })

	// 2. defaults, then the file, then the environment, then the flags.
	values := map[string]string{}
	for _, s := range settings {
		values[s.name] = s.def
	}
	path := *configPath
	if path == "" {
		path = getenv("STR_CONFIG")
	}
	if path != "" {
		fileVals, err := readConfigFile(path)
		if err != nil {
			return nil, err
		}
		for k, v := range fileVals {
			values[k] = v
		}
	}
	for _, s := range settings {
		if v := getenv(s.name); v != "" {
			values[s.name] = v
		}
		if setFlags[s.flag] {
			values[s.name] = *flagVals[s.name]
		}
	}
	// 3. relative paths, against the working directory.
	var problems []error
	toolsDirGiven := values["TOOLS_PYTHON_DIR"]
	wd, wdErr := os.Getwd()
	for _, name := range relativePathSettings {
		switch v := values[name]; {
		case v == "":
		case filepath.IsAbs(v):
			values[name] = filepath.Clean(v)
		case wdErr != nil:
			problems = append(problems, fmt.Errorf("%s=%q: relative, and the working directory is unknown: %w", name, v, wdErr))
		default:
			values[name] = filepath.Join(wd, v)
		}
	}
	// 4. typed values, every problem collected.
	c, err := configFromValues(values)
	if err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	c.toolsDirGiven = toolsDirGiven
	return c, nil
}

func readConfigFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var raw map[string]yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	known := map[string]bool{}
	for _, s := range settings {
		known[s.name] = true
	}
	out := map[string]string{}
	var problems []error
	for _, k := range sortedKeys(raw) {
		n := raw[k]
		switch {
		case !known[k]:
			problems = append(problems, fmt.Errorf("config file %s line %d: unknown setting %q", path, n.Line, k))
		case n.Kind != yaml.ScalarNode:
			problems = append(problems, fmt.Errorf("config file %s line %d: %s must be a scalar", path, n.Line, k))
		default:
			out[k] = n.Value
		}
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	return out, nil
}

func configFromValues(v map[string]string) (*Config, error) {
	var problems []error
	bad := func(name string, why string) {
		problems = append(problems, fmt.Errorf("%s=%q: %s", name, v[name], why))
	}
	integer := func(name string, min int) int {
		n, err := strconv.Atoi(strings.TrimSpace(v[name]))
		if err != nil {
			bad(name, "not an integer")
			return 0
		}
		if n < min {
			bad(name, fmt.Sprintf("must be at least %d", min))
		}
		return n
	}
	number := func(name string) float64 {
		f, err := strconv.ParseFloat(strings.TrimSpace(v[name]), 64)
		if err != nil || f < 0 {
			bad(name, "not a non-negative number")
			return 0
		}
		return f
	}
	ms := func(name string) time.Duration { return time.Duration(integer(name, 0)) * time.Millisecond }
	secs := func(name string, min int) time.Duration { return time.Duration(integer(name, min)) * time.Second }

	c := &Config{
		Namespace: v["SAM_NAMESPACE"], WorkerID: v["SAM_WORKER_ID"], ManifestPath: v["MANIFEST_PATH"],
		ToolsDir: v["TOOLS_PYTHON_DIR"], DefaultTimeout: secs("DEFAULT_TIMEOUT_SECONDS", 1),
		DevBrokerHost: v["DEV_BROKER_HOST"], DevBrokerPort: integer("DEV_BROKER_PORT", 1), DevBrokerPool: v["DEV_BROKER_POOL_NAME"],
		ConnectRetries: integer("CONNECT_RETRIES", 0), ConnectRetryDelay: ms("CONNECT_RETRY_DELAY_MS"),
		EmbeddedBroker: v["STR_EMBEDDED_BROKER"],
		SolaceHost:     v["SOLACE_HOST"], SolaceVPN: v["SOLACE_VPN"], SolaceUsername: v["SOLACE_USERNAME"],
		SolacePassword: v["SOLACE_PASSWORD"], SolaceTrustStorePath: v["SOLACE_TRUST_STORE_PATH"],
		SolaceClientCertPath: v["SOLACE_CLIENT_CERT_PATH"], SolaceClientKeyPath: v["SOLACE_CLIENT_KEY_PATH"],
		SolaceReconnectTries: integer("SOLACE_RECONNECT_RETRIES", -1), SolaceReconnectDelay: ms("SOLACE_RECONNECT_DELAY_MS"),
		SandboxMode: SandboxMode(v["SANDBOX_MODE"]), PythonBin: v["SANDBOX_PYTHON_BIN"], WorkDir: v["SANDBOX_WORK_DIR"], DefaultProfile: v["SANDBOX_DEFAULT_PROFILE"],
		MaxConcurrent: integer("SANDBOX_MAX_CONCURRENT", 1), MaxQueued: integer("SANDBOX_MAX_QUEUED", 0),
		ProfileDir: v["SANDBOX_PROFILE_DIR"], CgroupParent: v["SANDBOX_CGROUP_PARENT"],
		RunnerDir: v["STR_RUNNER_DIR"], SiteDir: v["STR_SITE_DIR"], PackageIndex: v["STR_PACKAGE_INDEX_URL"],
		ArtifactType: v["ARTIFACT_SERVICE_TYPE"], ArtifactBasePath: v["ARTIFACT_BASE_PATH"],
		ArtifactS3Bucket: cmp.Or(v["ARTIFACT_S3_BUCKET"], v["S3_BUCKET_NAME"]), ArtifactS3Region: cmp.Or(v["ARTIFACT_S3_REGION"], v["S3_REGION"]),
		ArtifactS3Endpoint: v["S3_ENDPOINT_URL"], ArtifactS3PathStyle: v["ARTIFACT_S3_PATH_STYLE"],
		ArtifactGCSBuck: v["ARTIFACT_GCS_BUCKET"], ArtifactGCSCredentials: v["GCS_CREDENTIALS_JSON"],
		ArtifactAuditLog: v["ARTIFACT_AUDIT_LOG"], ArtifactMemoryMaxBytes: int64(integer("ARTIFACT_MEMORY_MAX_BYTES", 1)),
		HealthAddr: v["HEALTH_ADDR"], HealthPort: integer("HEALTH_PORT", 0),
		MaxPayloadBytes: integer("STR_MAX_PAYLOAD_BYTES", 1024), MaxOutputBytes: int64(integer("STR_MAX_OUTPUT_BYTES", 0)),
		ShutdownGrace: secs("SHUTDOWN_GRACE_SECONDS", 0), SigningSecret: v["STR_SIGNING_SECRET"],
		SigningKeys: v["STR_SIGNING_KEYS"], UserTokenKeys: v["STR_USER_TOKEN_KEYS"], UserTokenAudience: v["STR_USER_TOKEN_AUDIENCE"],
		UserTokenIssuer: v["STR_USER_TOKEN_ISSUER"], UserTokenClaim: v["STR_USER_TOKEN_CLAIM"],
		UserTokenMaxLifetime: secs("STR_USER_TOKEN_MAX_LIFETIME_SECONDS", 1),
		RatePerMinute:        number("STR_USER_RATE_PER_MINUTE"), RateBurst: integer("STR_USER_RATE_BURST", 0),
		ReloadInterval: ms("STR_MANIFEST_POLL_MS"), LogLevel: v["STR_LOG_LEVEL"],
		ProbeInterval: ms("STR_BROKER_PROBE_INTERVAL_MS"), ProbeTimeout: ms("STR_BROKER_PROBE_TIMEOUT_MS"),
		WarmDefault: integer("STR_WARM_DEFAULT", 0), WarmMaxAge: secs("STR_WARM_MAX_AGE_SECONDS", 1),
		TemplateStartTimeout: secs("STR_TEMPLATE_START_TIMEOUT_SECONDS", 1),
		ActiveMimeTypes:      v["ARTIFACT_ACTIVE_MIME_TYPES"], MetricsAddr: v["METRICS_ADDR"], MetricsToken: v["METRICS_TOKEN"],
		HealthDetail: v["HEALTH_DETAIL"],
	}
	if b, err := strconv.ParseBool(strings.TrimSpace(v["STR_PACKAGE_ALLOW_BUILDS"])); err != nil {
		bad("STR_PACKAGE_ALLOW_BUILDS", "must be true or false")
	} else {
		c.PackageBuilds = b
	}
	for _, h := range strings.Split(v["STR_PACKAGE_HOSTS"], ",") {
		if h = strings.TrimSpace(h); h != "" {
			c.PackageHosts = append(c.PackageHosts, h)
		}
	}
	// Fair shares and quotas.
	auto := func(name string) int {
		if strings.TrimSpace(v[name]) == "auto" {
			return -1
		}
		return integer(name, 0)
	}
	c.UserMaxRunning, c.UserMaxQueued = auto("STR_USER_MAX_RUNNING"), auto("STR_USER_MAX_QUEUED")
	if c.UserMaxRunning == 0 {
		bad("STR_USER_MAX_RUNNING", "must be auto or at least 1")
	}
	c.KeyMaxRunning, c.KeyMaxQueued = auto("STR_KEY_MAX_RUNNING"), auto("STR_KEY_MAX_QUEUED")
	if c.KeyMaxRunning == 0 {
		bad("STR_KEY_MAX_RUNNING", "must be auto or at least 1")
	}
	size := func(name string) int64 {
		q, err := profiles.ParseBytes(strings.TrimSpace(v[name]))
		if err != nil {
			bad(name, "not a size (e.g. 512Mi, 1Gi, 0 for none): "+err.Error())
		}
		return int64(q)
	}
	c.ArtifactQuota = artifacts.Quota{
		UserBytes: size("ARTIFACT_USER_MAX_BYTES"), UserVersions: integer("ARTIFACT_USER_MAX_VERSIONS", 0),
		SessionBytes: size("ARTIFACT_SESSION_MAX_BYTES"), SessionVersions: integer("ARTIFACT_SESSION_MAX_VERSIONS", 0),
	}
	if q, err := profiles.ParseBytes(strings.TrimSpace(v["STR_WARM_MEMORY"])); err != nil {
		bad("STR_WARM_MEMORY", "not a size (e.g. 512Mi, 4Gi): "+err.Error())
	} else {
		c.WarmMemory = int64(q)
	}
	if c.WarmDefault > manifest.MaxWarm {
		bad("STR_WARM_DEFAULT", fmt.Sprintf("must be at most %d", manifest.MaxWarm))
	}
	// Cross-field checks.
	if strings.Trim(c.Namespace, "/") == "" {
		bad("SAM_NAMESPACE", "required (an empty namespace is a configuration error)")
	}
	if c.UserTokenKeys != "" && c.UserTokenAudience == "" {
		bad("STR_USER_TOKEN_AUDIENCE", "required with STR_USER_TOKEN_KEYS (a token minted for another service must not be accepted)")
	}
	if c.UserTokenClaim == "" {
		bad("STR_USER_TOKEN_CLAIM", "must name a claim")
	}
	if c.HealthPort > 65535 {
		bad("HEALTH_PORT", "not a port")
	}
	if h := c.HealthAddr; h == "" || strings.ContainsAny(h, "/[] \t") || (strings.Contains(h, ":") && net.ParseIP(h) == nil) {
		bad("HEALTH_ADDR", "must be an IP address or a host name, without a port (the port is HEALTH_PORT)")
	}
	switch c.ActiveMimeTypes {
	case "fallback", "keep":
	default:
		bad("ARTIFACT_ACTIVE_MIME_TYPES", "must be fallback or keep")
	}
	if c.MetricsAddr != "" {
		if _, port, err := net.SplitHostPort(c.MetricsAddr); err != nil || port == "" {
			bad("METRICS_ADDR", "must be host:port (e.g. 127.0.0.1:9090)")
		}
	}
	switch c.HealthDetail {
	case "auto", "full", "minimal":
	default:
		bad("HEALTH_DETAIL", "must be auto, full or minimal")
	}
	switch c.SandboxMode {
	case ModeSandbox, ModeNone:
	default:
		bad("SANDBOX_MODE", `must be "sandbox" or "none"`)
	}
	if c.DevBrokerPort > 65535 {
		bad("DEV_BROKER_PORT", "not a port")
	}
	if c.EmbeddedBroker != "" {
		if _, _, err := net.SplitHostPort(c.EmbeddedBroker); err != nil {
			bad("STR_EMBEDDED_BROKER", "not host:port")
		}
	}
	switch c.ArtifactType {
	case "memory", "filesystem":
	case "s3":
		if c.ArtifactS3Bucket == "" {
			bad("ARTIFACT_S3_BUCKET", "required with ARTIFACT_SERVICE_TYPE=s3 (or S3_BUCKET_NAME)")
		}
		if u, err := url.Parse(c.ArtifactS3Endpoint); c.ArtifactS3Endpoint != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
			bad("S3_ENDPOINT_URL", "must be an http:// or https:// URL with a host")
		}
	case "gcs":
		if c.ArtifactGCSBuck == "" {
			bad("ARTIFACT_GCS_BUCKET", "required with ARTIFACT_SERVICE_TYPE=gcs")
		}
	default:
		bad("ARTIFACT_SERVICE_TYPE", "must be memory, filesystem, s3 or gcs")
	}
	switch c.ArtifactS3PathStyle {
	case "auto", "true", "false":
	default:
		bad("ARTIFACT_S3_PATH_STYLE", "must be auto, true or false")
	}
	if c.WorkerID == "" || unsafeName(c.WorkerID, maxIDLen) != "" {
		bad("SAM_WORKER_ID", "must be a non-empty name without / or ..")
	}
	if c.DevBrokerPool != "" && unsafeName(c.DevBrokerPool, maxIDLen) != "" {
		bad("DEV_BROKER_POOL_NAME", "must be a name without / or ..")
	}
	if c.ReloadInterval <= 0 || c.ReloadInterval > 2*time.Second {
		bad("STR_MANIFEST_POLL_MS", "must be between 1 and 2000 (reload within 2 s)")
	}
	if c.ProbeInterval > 0 && c.ProbeTimeout <= 0 {
		bad("STR_BROKER_PROBE_TIMEOUT_MS", "must be at least 1 while the probe is on (STR_BROKER_PROBE_INTERVAL_MS > 0)")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("STR_LOG_LEVEL", "must be debug, info, warn or error")
	}
	if c.SolaceHost == "" && c.DevBrokerHost == "" && c.EmbeddedBroker == "" {
		problems = append(problems, errors.New("no broker: set SOLACE_HOST, DEV_BROKER_HOST or STR_EMBEDDED_BROKER (--embedded-broker)"))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("configuration: %w", errors.Join(problems...))
	}
	return c, nil
}

// userMaxRunning is STR_USER_MAX_RUNNING, auto resolved: one less than
// SANDBOX_MAX_CONCURRENT (at least 1), and never more than it.
func (c *Config) userMaxRunning() int {
	if c.UserMaxRunning < 0 {
		return max(1, c.MaxConcurrent-1)
	}
	return min(c.UserMaxRunning, c.MaxConcurrent)
}

// userMaxQueued is STR_USER_MAX_QUEUED, auto resolved: a quarter of
// SANDBOX_MAX_QUEUED (at least 1).
func (c *Config) userMaxQueued() int {
	if c.UserMaxQueued < 0 {
		return max(1, c.MaxQueued/4)
	}
	return c.UserMaxQueued
}

// keyMaxRunning is STR_KEY_MAX_RUNNING, auto resolved as
// STR_USER_MAX_RUNNING's auto: one agent key is one share, like one user,
// whatever number of users it claims.
func (c *Config) keyMaxRunning() int {
	if c.KeyMaxRunning < 0 {
		return max(1, c.MaxConcurrent-1)
	}
	return min(c.KeyMaxRunning, c.MaxConcurrent)
}

// keyMaxQueued is STR_KEY_MAX_QUEUED, auto resolved as
// STR_USER_MAX_QUEUED's auto.
func (c *Config) keyMaxQueued() int {
	if c.KeyMaxQueued < 0 {
		return max(1, c.MaxQueued/4)
	}
	return c.KeyMaxQueued
}

// Base is the topic base: namespace without trailing "/" + "/a2a/v1".
func (c *Config) Base() string { return TopicBase(c.Namespace) }

// TopicBase is the topic base of a namespace (spec §1).
func TopicBase(namespace string) string {
	return strings.TrimRight(namespace, "/") + "/a2a/v1"
}

// HealthListenAddr is the host:port the health server listens on.
func (c *Config) HealthListenAddr() string {
	return net.JoinHostPort(c.HealthAddr, strconv.Itoa(c.HealthPort))
}

// QueueName is the worker's queue name on the dev broker: its own (spec
// §1), or its pool's when DEV_BROKER_POOL_NAME is set (the broker's queue
// group: each request goes to one worker of the pool).
func (c *Config) QueueName() string {
	if c.DevBrokerPool != "" {
		return strings.Trim(c.Namespace, "/") + "/q/sandbox/pool/" + c.DevBrokerPool
	}
	return strings.Trim(c.Namespace, "/") + "/q/sandbox/" + c.WorkerID
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/internal/jsonlog"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/install"
	"github.com/securetoolruntime/str/launcher/template"
	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/profiles/profileyaml"
	"github.com/securetoolruntime/str/worker"
	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
	"github.com/securetoolruntime/str/worker/transport/solace"
)

// cmdWorker runs the worker (`str worker`, `str-worker`): configuration (flags > env > file >
// defaults, see worker.ConfigUsage), then the server until SIGTERM/SIGINT.
func cmdWorker(args []string) int {
	cfg, err := worker.LoadConfig(args, os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "str worker: %v\n", err)
		return 2
	}
	log := jsonlog.New(cfg.LogLevel)
	if err := runWorker(cfg, log); err != nil {
		log.Error("worker failed", "error", err.Error())
		fmt.Fprintf(os.Stderr, "str worker: %v\n", err)
		return 1
	}
	return 0
}

func runWorker(cfg *worker.Config, log *slog.Logger) error {
	// 1. signals: the first SIGTERM/SIGINT starts the graceful shutdown.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// 2. the embedded dev broker, when asked for; the worker connects to it
	// with the token it writes to the port's token file (see str broker
	// --help; newTransport reads the same file).
	if cfg.EmbeddedBroker != "" {
		token := broker.NewToken()
		srv := broker.NewServer(broker.Options{Token: token, Logger: log})
		if err := srv.Listen(cfg.EmbeddedBroker); err != nil {
			return fmt.Errorf("embedded broker on %s: %w", cfg.EmbeddedBroker, err)
		}
		defer srv.Close()
		path, err := srv.PublishTokenFile("", token)
		if err != nil {
			return fmt.Errorf("embedded broker on %s: %w", cfg.EmbeddedBroker, err)
		}
		defer broker.RemoveTokenFile(path, token)
		host, port, _ := net.SplitHostPort(srv.Addr().String())
		cfg.DevBrokerHost = host
		cfg.DevBrokerPort, _ = strconv.Atoi(port)
		log.Info("embedded dev broker listening", "addr", srv.Addr().String(), "token_file", path)
	}

	// 3. the transport.
	tr, err := newTransport(cfg, log)
	if err != nil {
		return err
	}
	defer tr.Close()

	// 4. the sandboxes (the launcher; without any isolation only when
	// SANDBOX_MODE=none says so) and the artifact store.
	var (
		sandboxes worker.Sandboxes
		set       *profiles.Set
		pip       manifest.PipRunner // nil without a launcher: the wheel unpacker only
	)
	switch cfg.SandboxMode {
	case worker.ModeNone:
		if set, err = profiles.Embedded(); err == nil && cfg.ProfileDir != "" {
			err = profileyaml.LoadDir(set, cfg.ProfileDir)
		}
		if err != nil {
			return err
		}
		sandboxes = worker.Unsandboxed{Profiles: set}
	default:
		l, err := launcher.New(launcher.Options{ProfileDir: cfg.ProfileDir, Decoder: profileyaml.Decoder{}, CgroupParent: cfg.CgroupParent, LongLived: true, RequireCgroup: true, Logger: log})
		if err != nil {
			return err
		}
		// With per-tool templates (root mode only: they lease host ids).
		sandboxes, set = template.Provider(l), l.Profiles()
		pip = sandboxedPip{l: l, python: cfg.PythonBin}
	}
	store, auditLog, err := artifacts.Open(artifacts.Settings{
		Type: cfg.ArtifactType, BasePath: cfg.ArtifactBasePath, Namespace: cfg.Namespace,
		AuditLog: cfg.ArtifactAuditLog, MemoryMaxBytes: cfg.ArtifactMemoryMaxBytes,
		S3: artifacts.S3Settings{Bucket: cfg.ArtifactS3Bucket, Region: cfg.ArtifactS3Region,
			Endpoint: cfg.ArtifactS3Endpoint, PathStyle: cfg.ArtifactS3PathStyle},
		GCS: artifacts.GCSSettings{Bucket: cfg.ArtifactGCSBuck, CredentialsJSON: cfg.ArtifactGCSCredentials},
	})
	if err != nil {
		return fmt.Errorf("artifact store (%s): %w", cfg.ArtifactType, err)
	}
	log.Info("artifact store", "type", cfg.ArtifactType, "audit_log", auditLog)
	if cfg.ArtifactType == "memory" {
		log.Warn("artifacts are kept in this process's memory: agents cannot read them, and the least recently used are evicted beyond ARTIFACT_MEMORY_MAX_BYTES; use ARTIFACT_SERVICE_TYPE=filesystem in deployments",
			"budget_bytes", cfg.ArtifactMemoryMaxBytes)
	}

	// 5. the server and its health/metrics endpoint.
	srv, err := worker.New(worker.Options{
		Config: cfg, Transport: tr, Sandboxes: sandboxes, Profiles: set, Store: store, Logger: log,
		Installer: &manifest.Installer{
			Python: cfg.PythonBin, SiteDir: cfg.SiteDir,
			WheelsDir: filepath.Join(filepath.Dir(cfg.ManifestPath), "wheels"), IndexURL: cfg.PackageIndex,
			ExtraHosts: cfg.PackageHosts, AllowBuilds: cfg.PackageBuilds, Pip: pip,
		},
	})
	if err != nil {
		return err
	}
	if cfg.HealthPort > 0 {
		hs := &http.Server{Addr: cfg.HealthListenAddr(), Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
		ln, err := net.Listen("tcp", hs.Addr)
		if err != nil {
			return fmt.Errorf("health server on %s (HEALTH_ADDR, HEALTH_PORT): %w", hs.Addr, err)
		}
		go hs.Serve(ln)
		defer hs.Close()
		log.Info("health listening", "addr", ln.Addr().String(), "metrics", cfg.MetricsAddr == "", "metrics_token", cfg.MetricsToken != "")
	}
	if cfg.MetricsAddr != "" {
		ms := &http.Server{Addr: cfg.MetricsAddr, Handler: metricsOnly(srv.MetricsHandler()), ReadHeaderTimeout: 10 * time.Second}
		ln, err := net.Listen("tcp", ms.Addr)
		if err != nil {
			return fmt.Errorf("metrics server on %s (METRICS_ADDR): %w", ms.Addr, err)
		}
		go ms.Serve(ln)
		defer ms.Close()
		log.Info("metrics listening", "addr", ln.Addr().String(), "metrics_token", cfg.MetricsToken != "")
	}

	// 6. serve until the signal; Run answers everything it took.
	return srv.Run(ctx)
}

// metricsOnly serves h at /metrics and nothing else.
func metricsOnly(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	return mux
}

// sandboxedPip runs the installer's pip jobs in installation sandboxes
// of the launcher (launcher/install).
type sandboxedPip struct {
	l      *launcher.Launcher
	python string
}

func (p sandboxedPip) RunPip(ctx context.Context, job manifest.PipJob) error {
	_, err := install.Run(ctx, p.l, install.Spec{
		Python: p.python, Requirement: job.Requirement, Target: job.Target,
		WheelsDir: job.WheelsDir, IndexURL: job.IndexURL, ExtraHosts: job.ExtraHosts,
		AllowBuilds: job.AllowBuilds, Output: job.Output,
	})
	return err
}

// newTransport picks the broker: SOLACE_HOST, else the dev broker.
func newTransport(cfg *worker.Config, log *slog.Logger) (transport.Transport, error) {
	if cfg.SolaceHost != "" {
		return newSolaceTransport(cfg, log)
	}
	c, err := devbroker.NewClient(devbroker.ClientOptions{
		Host: cfg.DevBrokerHost, Port: cfg.DevBrokerPort, TokenFile: broker.TokenFileFor(cfg.DevBrokerPort),
		ClientID: cfg.WorkerID, QueueName: cfg.QueueName(),
		RetryDelay: cfg.ConnectRetryDelay, Retries: cfg.ConnectRetries, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("dev broker client: %w", err)
	}
	return c, nil
}

// newSolaceTransport builds the Solace PubSub+ transport. The SOLACE_*
// settings the worker's config knows come from it (so flags and the config
// file take precedence as documented); the transport's own extras
// (SOLACE_DELIVERY_MODE, SOLACE_QUEUE_NAME, SOLACE_POOL_NAME,
// SOLACE_CLIENT_NAME, SOLACE_RECEIVE_BUFFER) come from the environment.
func newSolaceTransport(cfg *worker.Config, log *slog.Logger) (transport.Transport, error) {
	known := map[string]string{
		"SOLACE_HOST": cfg.SolaceHost, "SOLACE_VPN": cfg.SolaceVPN,
		"SOLACE_USERNAME": cfg.SolaceUsername, "SOLACE_PASSWORD": cfg.SolacePassword,
		"SOLACE_TRUST_STORE_PATH": cfg.SolaceTrustStorePath,
		"SOLACE_CLIENT_CERT_PATH": cfg.SolaceClientCertPath, "SOLACE_CLIENT_KEY_PATH": cfg.SolaceClientKeyPath,
		"SOLACE_RECONNECT_RETRIES":  strconv.Itoa(cfg.SolaceReconnectTries),
		"SOLACE_RECONNECT_DELAY_MS": strconv.FormatInt(cfg.SolaceReconnectDelay.Milliseconds(), 10),
	}
	getenv := func(k string) string {
		if v, ok := known[k]; ok {
			return v
		}
		return os.Getenv(k)
	}
	scfg, err := solace.ConfigFromEnv(getenv, cfg.Namespace, cfg.WorkerID)
	if err != nil {
		return nil, fmt.Errorf("solace: %w", err)
	}
	t, err := solace.New(scfg, log)
	if err != nil {
		return nil, fmt.Errorf("solace: %w", err)
	}
	return t, nil
}

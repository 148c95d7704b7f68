// Package objstoretest starts real object stores for tests, each on
// loopback with a directory of its own: versitygw (an S3 gateway storing
// objects as files) for the s3 artifact store and fake-gcs-server (a GCS
// emulator) for the gcs one. The artifact store's tests and the worker's
// use it, so "the store is down" means the same thing in each.
//
// The programs are found on PATH, else in the repository's bin/tools
// (make test-tools installs them there); without them a test skips with
// the reason, and fails with STR_MUST_WORK=1.
//
// It protects against nothing; it is test support.
package objstoretest

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/internal/syncbuf"
)

// The S3 server's credentials, and the bucket both servers start with.
const (
	S3Access = "str-test-access"
	S3Secret = "str-test-secret-key"
	Bucket   = "artifacts"
)

// VersitygwSpec is the S3 server as make test-tools installs it (the
// fleet test runs it in a container of its own: Tool finds the binary).
const VersitygwSpec = versitygw

// The programs, as make test-tools installs them.
const (
	versitygw     = "github.com/versity/versitygw/cmd/versitygw@v1.8.0"
	fakeGCSServer = "github.com/fsouza/fake-gcs-server@v1.56.1"
)

// Tool returns the path of the program name: on PATH, else in the
// repository's bin/tools. Without it the test skips (fails with
// STR_MUST_WORK=1), saying how to install it (go install spec).
func Tool(t testing.TB, name, spec string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	dir, _ := os.Getwd()
	for ; dir != filepath.Dir(dir); dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "bin", "tools", name)
			if _, err := os.Stat(p); err == nil {
				return p
			}
			break
		}
	}
	mustwork.Skip(t, name+" is not on PATH nor in bin/tools (make test-tools, or: go install "+spec+")")
	return ""
}

// Server is one store process serving Root on Addr; Stop and Start kill
// and restart it on the same address and directory.
type Server struct {
	Addr string // 127.0.0.1:port
	Root string // the directory it keeps its buckets in

	t    testing.TB
	argv func(addr string) []string
	cmd  *exec.Cmd
	done chan struct{}
	log  *syncbuf.Buffer
}

// S3 starts versitygw serving a new directory (each subdirectory a
// bucket, created with Bucket) and puts its credentials in the
// environment, where the AWS chain reads them, and nothing else of the
// chain (no config file, no instance metadata). It is stopped when the
// test ends.
func S3(t *testing.T) *Server {
	t.Helper()
	bin := Tool(t, "versitygw", versitygw)
	tmp := t.TempDir()
	t.Setenv("AWS_ACCESS_KEY_ID", S3Access)
	t.Setenv("AWS_SECRET_ACCESS_KEY", S3Secret)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(tmp, "no-aws-config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(tmp, "no-aws-credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	s := &Server{t: t, Root: filepath.Join(tmp, "gw")}
	if err := os.MkdirAll(filepath.Join(s.Root, Bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	s.argv = func(addr string) []string {
		return []string{bin, "--port", addr, "--access", S3Access, "--secret", S3Secret, "--quiet", "posix", s.Root}
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// GCS starts fake-gcs-server keeping its objects in a new directory,
// with the bucket Bucket, and points STORAGE_EMULATOR_HOST at it. It is
// stopped when the test ends.
func GCS(t *testing.T) *Server {
	t.Helper()
	bin := Tool(t, "fake-gcs-server", fakeGCSServer)
	s := &Server{t: t, Root: t.TempDir()}
	if err := os.Mkdir(filepath.Join(s.Root, Bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	s.argv = func(addr string) []string {
		_, port, _ := net.SplitHostPort(addr)
		return []string{bin, "-scheme", "http", "-host", "127.0.0.1", "-port", port,
			"-backend", "filesystem", "-filesystem-root", s.Root, "-log-level", "error"}
	}
	s.Start()
	t.Cleanup(s.Stop)
	t.Setenv("STORAGE_EMULATOR_HOST", s.Addr)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
	return s
}

// Endpoint is the server's URL.
func (s *Server) Endpoint() string { return "http://" + s.Addr }

// Start runs the server (again, on the same address and directory after
// Stop) and waits until it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	if s.Addr == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			s.t.Fatal(err)
		}
		s.Addr = ln.Addr().String()
		ln.Close()
	}
	argv := s.argv(s.Addr)
	s.log = &syncbuf.Buffer{}
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(s.cmd, s.done)
	name := filepath.Base(argv[0])
	for deadline := time.Now().Add(2 * time.Minute); ; {
		c, err := net.Dial("tcp", s.Addr)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-s.done:
			s.t.Fatalf("%s exited: %s", name, s.log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s does not listen on %s: %s", name, s.Addr, s.log.String())
		}
	}
}

// Stop kills the server and waits for it to exit (nothing when stopped).
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

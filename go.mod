module github.com/securetoolruntime/str

go 1.26.0

// The toolchain str is built and tested with.
toolchain go1.26.8

require (
	github.com/go-jose/go-jose/v4 v4.1.9
	github.com/seccomp/libseccomp-golang v0.11.1
	golang.org/x/net v0.59.0
	golang.org/x/sys v0.49.0
	golang.org/x/text v0.43.0
	gopkg.in/yaml.v3 v3.0.1
	solace.dev/go/messaging v1.10.1
)

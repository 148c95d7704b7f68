package proxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"
)

// CA is the proxy's certificate authority for terminated connections: a
// P-256 key and a self-signed certificate made in memory (NewCA), whose key
// is never written anywhere. Leaf certificates are minted per host on
// first use and cached until they near expiry. The CA certificate (never
// the key) is what a sandbox is made to trust.
type CA struct {
	cert    *x509.Certificate
	certDER []byte
	key     *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// Lifetimes. The CA lives as long as its worker (a worker that runs longer
// than caValidity must restart; str run's CA lives for one call); leaves
// are re-minted when less than leafRenew of their life is left.
const (
	caValidity   = 90 * 24 * time.Hour
	leafValidity = 7 * 24 * time.Hour
	leafRenew    = 24 * time.Hour
	// clockSkew backdates NotBefore, so a sandbox whose clock is slightly
	// behind still accepts a fresh certificate.
	clockSkew = time.Hour
	// maxLeaves bounds the cache (wildcard patterns could name many
	// hosts); when full it is emptied and refilled on demand.
	maxLeaves = 1024
)

// NewCA creates a CA in memory.
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress: CA key: %w", err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "str egress proxy CA (per worker, in memory)", Organization: []string{"str"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true, // leaves only: this CA signs no other CA
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("egress: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("egress: CA certificate: %w", err)
	}
	return &CA{cert: cert, certDER: der, key: key, leaves: make(map[string]*tls.Certificate)}, nil
}

// CertPEM is the CA certificate in PEM form (what the sandbox trusts).
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.certDER})
}

// Certificate is the parsed CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Leaf returns a certificate for host (a normalized DNS name), minting it
// on first use.
func (ca *CA) Leaf(host string) (*tls.Certificate, error) {
	now := time.Now()
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok && c.Leaf != nil && now.Before(c.Leaf.NotAfter.Add(-leafRenew)) {
		return c, nil
	}
	if len(ca.leaves) >= maxLeaves {
		clear(ca.leaves)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress: leaf key for %s: %w", host, err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(leafValidity)
	if ca.cert.NotAfter.Before(notAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("egress: leaf certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("egress: leaf certificate for %s: %w", host, err)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.certDER}, PrivateKey: key, Leaf: leaf}
	ca.leaves[host] = c
	return c, nil
}

func randSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("egress: certificate serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

// UpstreamRoots is the pool upstream servers are verified against: the
// host's trust store (x509.SystemCertPool) plus the certificates in extra
// (PEM: an operator's private CA; the tests' own CA), when given. PEM that
// holds no certificate is an error, never an empty addition.
func UpstreamRoots(extra []byte) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if len(extra) == 0 {
		return pool, nil
	}
	if !pool.AppendCertsFromPEM(extra) {
		return nil, errors.New("egress: extra upstream roots: no PEM certificate in the file")
	}
	return pool, nil
}

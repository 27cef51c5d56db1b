package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the paths of the key material in <data-dir>/pki. It is generated
// once, on the first start, and reused on every restart.
type pki struct {
	dir string
}

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

// CA that signs the serving certificate, the admin client certificate and
// (through the controller manager) CSRs; also the apiserver's client CA.
func (p pki) caCert() string { return p.path("ca.crt") }
func (p pki) caKey() string  { return p.path("ca.key") }

// Serving certificate of kube-apiserver.
func (p pki) servingCert() string { return p.path("apiserver.crt") }
func (p pki) servingKey() string  { return p.path("apiserver.key") }

// Admin client certificate (O=system:masters).
func (p pki) adminCert() string { return p.path("admin.crt") }
func (p pki) adminKey() string  { return p.path("admin.key") }

// Service account token signing key pair.
func (p pki) saKey() string { return p.path("sa.key") }
func (p pki) saPub() string { return p.path("sa.pub") }

// ensurePKI returns the key material in dataDir/pki, generating it when it is
// not there. Generation happens in a scratch directory that is renamed into
// place, so a crash never leaves half a PKI behind.
func ensurePKI(dataDir string) (pki, error) {
	p := pki{dir: filepath.Join(dataDir, "pki")}
	if _, err := os.Stat(p.caCert()); err == nil {
		return p, nil
	}
	tmp, err := os.MkdirTemp(dataDir, ".pki-")
	if err != nil {
		return p, err
	}
	defer os.RemoveAll(tmp)
	if err := generatePKI(pki{dir: tmp}); err != nil {
		return p, fmt.Errorf("generating certificates: %w", err)
	}
	_ = os.RemoveAll(p.dir) // a partial directory from an older crash, if any
	if err := os.Rename(tmp, p.dir); err != nil {
		return p, err
	}
	return p, nil
}

func generatePKI(p pki) error {
	notBefore := time.Now().Add(-time.Hour)
	notAfter := notBefore.Add(10 * 365 * 24 * time.Hour)

	caKey, err := newKey()
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "localkube-ca"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caCert, err := sign(caTmpl, caKey.Public(), nil, caKey)
	if err != nil {
		return err
	}
	if err := writeCertAndKey(p.caCert(), p.caKey(), caCert, caKey); err != nil {
		return err
	}

	servingKey, err := newKey()
	if err != nil {
		return err
	}
	servingCert, err := sign(&x509.Certificate{
		Subject:   pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: notBefore,
		NotAfter:  notAfter,
		KeyUsage:  x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{
			x509.ExtKeyUsageServerAuth,
		},
		DNSNames: []string{
			"localhost",
			"kubernetes",
			"kubernetes.default",
			"kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local",
		},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP(serviceClusterFirstIP)},
	}, servingKey.Public(), caCert, caKey)
	if err != nil {
		return err
	}
	if err := writeCertAndKey(p.servingCert(), p.servingKey(), servingCert, servingKey); err != nil {
		return err
	}

	adminKey, err := newKey()
	if err != nil {
		return err
	}
	adminCert, err := sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "localkube-admin", Organization: []string{"system:masters"}},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, adminKey.Public(), caCert, caKey)
	if err != nil {
		return err
	}
	if err := writeCertAndKey(p.adminCert(), p.adminKey(), adminCert, adminKey); err != nil {
		return err
	}

	saKey, err := newKey()
	if err != nil {
		return err
	}
	if err := writeKey(p.saKey(), saKey); err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return err
	}
	return os.WriteFile(p.saPub(), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600)
}

func newKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// sign creates a certificate from tmpl for pub, signed by parent/parentKey, or
// self-signed when parent is nil.
func sign(tmpl *x509.Certificate, pub crypto.PublicKey, parent *x509.Certificate, parentKey crypto.Signer) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	ski := sha1.Sum(pubDER)
	tmpl.SubjectKeyId = ski[:]
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func writeCertAndKey(certPath, keyPath string, cert *x509.Certificate, key *ecdsa.PrivateKey) error {
	if err := os.WriteFile(certPath, certPEM(cert), 0o600); err != nil {
		return err
	}
	return writeKey(keyPath, key)
}

func certPEM(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// writeKey writes key as PKCS#8 ("PRIVATE KEY"), which Go, rustls and the
// Kubernetes key loaders all accept.
func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

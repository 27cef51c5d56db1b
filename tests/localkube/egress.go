package main

// The API server's only way out to the cluster's network. kube-apiserver
// dials Services and Pods on a release's behalf: aggregated APIs
// (APIService), admission webhooks, CRD conversion webhooks, the service and
// pod proxy, a kubelet's logs and exec. With no kube-proxy a Service's
// ClusterIP (10.0.x.x) would be dialled through the machine's default route,
// off the machine. Every one of those dials goes through the API server's
// egress selector under the name "cluster"; localkube configures that
// selector to tunnel through an HTTP CONNECT proxy on a Unix socket, served
// here, which connects only to loopback addresses and refuses everything else
// with a status line that names the address. The API server then reports the
// webhook or APIService as unavailable, as it would on a cluster whose backend
// is down.
//
// Why the egress selector: it is the API server's documented hook for exactly
// these connections (Konnectivity uses it), it covers all of them through one
// dialer, and it is set by a flag, so localkube keeps calling the upstream
// Run unchanged at both supported minors.
//
// Every decision is appended to <data-dir>/egress.log, one line each
// ("refused 10.0.3.7:443 not a loopback address"), so a test can see that the
// dial was asked for and refused rather than inferring it from a timeout.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// egressLogFile is the name, in the data directory, of the record of every
// connection the API server asked for.
const egressLogFile = "egress.log"

// egressConfigFile is the EgressSelectorConfiguration handed to the API
// server.
const egressConfigFile = "egress-selector.yaml"

// egressGuard serves the CONNECT proxy until stopped.
type egressGuard struct {
	ln        net.Listener
	socketDir string
	mu        sync.Mutex
	record    *os.File
	wg        sync.WaitGroup
}

// startEgressGuard listens on a Unix socket (in a short temporary directory:
// a socket path must fit in 108 bytes, a test's data directory may not) and
// writes the API server's egress configuration into dataDir. It returns the
// guard and the configuration's path for --egress-selector-config-file.
func startEgressGuard(dataDir string) (*egressGuard, string, error) {
	socketDir, err := os.MkdirTemp("", "localkube-egress-")
	if err != nil {
		return nil, "", fmt.Errorf("egress guard: %w", err)
	}
	socket := filepath.Join(socketDir, "connect.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		os.RemoveAll(socketDir)
		return nil, "", fmt.Errorf("egress guard: listening on %s: %w", socket, err)
	}
	record, err := os.OpenFile(filepath.Join(dataDir, egressLogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		ln.Close()
		os.RemoveAll(socketDir)
		return nil, "", fmt.Errorf("egress guard: %w", err)
	}
	config := filepath.Join(dataDir, egressConfigFile)
	if err := writeFileAtomic(config, []byte(egressSelectorConfig(socket)), 0o600); err != nil {
		ln.Close()
		record.Close()
		os.RemoveAll(socketDir)
		return nil, "", fmt.Errorf("egress guard: %w", err)
	}
	g := &egressGuard{ln: ln, socketDir: socketDir, record: record}
	g.wg.Add(1)
	go g.serve()
	return g, config, nil
}

// egressSelectorConfig routes the "cluster" egress (everything the API server
// dials in the cluster's network) through the proxy on socket. The
// "controlplane" and "etcd" egresses stay direct: they are loopback here.
func egressSelectorConfig(socket string) string {
	return fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %q
`, socket)
}

// stop closes the listener, waits for the accept loop, and removes the
// socket's directory. Tunnels still open end with the process.
func (g *egressGuard) stop() {
	g.ln.Close()
	g.wg.Wait()
	os.RemoveAll(g.socketDir)
	g.mu.Lock()
	g.record.Close()
	g.mu.Unlock()
}

func (g *egressGuard) serve() {
	defer g.wg.Done()
	for {
		conn, err := g.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				logf("egress guard: accept: %v", err)
			}
			return
		}
		go g.handle(conn)
	}
}

// handle answers one CONNECT request: a tunnel to a loopback address, or a
// refusal naming the address.
func (g *egressGuard) handle(conn net.Conn) {
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(io.LimitReader(conn, http.DefaultMaxHeaderBytes))
	req, err := http.ReadRequest(br)
	if err != nil {
		conn.Close()
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	target := req.RequestURI
	if req.Method != http.MethodConnect {
		g.refuse(conn, target, "only CONNECT is served")
		return
	}
	addr, reason := loopbackTarget(target)
	if reason != "" {
		g.refuse(conn, target, reason)
		return
	}
	upstream, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(context.Background(), "tcp", addr)
	if err != nil {
		g.note("failed", target, err.Error())
		fmt.Fprintf(conn, "HTTP/1.1 502 localkube could not reach %s\r\n\r\n", sanitizeStatus(target))
		conn.Close()
		return
	}
	g.note("allowed", target, "")
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		conn.Close()
		upstream.Close()
		return
	}
	splice(conn, upstream)
}

// loopbackTarget returns the address to dial for a CONNECT target, or why it
// is refused. Only literal loopback addresses (127.0.0.0/8, ::1) and the name
// localhost pass: resolving any other name would itself send a query off the
// machine.
func loopbackTarget(target string) (string, string) {
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return "", "not a host:port address"
	}
	if strings.EqualFold(host, "localhost") {
		return net.JoinHostPort("127.0.0.1", port), ""
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return "", "a name, not a loopback address (localkube resolves no names)"
	}
	if !ip.IsLoopback() {
		return "", "not a loopback address"
	}
	return net.JoinHostPort(ip.String(), port), ""
}

// refuse answers 403 with a status line that the API server puts into its own
// error ("proxy error from … while dialing …, code 403: 403 …").
func (g *egressGuard) refuse(conn net.Conn, target, reason string) {
	g.note("refused", target, reason)
	fmt.Fprintf(conn, "HTTP/1.1 403 localkube dials loopback only: %s is %s\r\n\r\n", sanitizeStatus(target), reason)
	conn.Close()
}

// note records one decision in egress.log and, for refusals, on stderr.
func (g *egressGuard) note(outcome, target, reason string) {
	line := fmt.Sprintf("%s %s %s", outcome, sanitizeStatus(target), reason)
	if outcome != "allowed" {
		logf("egress %s", line)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	fmt.Fprintf(g.record, "%s %s\n", time.Now().UTC().Format(time.RFC3339Nano), strings.TrimSpace(line))
}

// sanitizeStatus keeps a target printable on one status line.
func sanitizeStatus(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}

// splice copies both ways until either side closes.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if c, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = c.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	// Once one side is finished, so is the tunnel: closing both ends the
	// other copy even if its peer never closes.
	<-done
	a.Close()
	b.Close()
	<-done
}

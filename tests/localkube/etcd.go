package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/klog/v2"
)

// etcdPorts is persisted in <data-dir>/etcd-ports.json so that a restart on
// the same data dir listens where the etcd member data says it does (when
// those ports are still free).
type etcdPorts struct {
	Client int `json:"client"`
	Peer   int `json:"peer"`
}

func etcdPortsFile(dataDir string) string { return filepath.Join(dataDir, "etcd-ports.json") }

// startEtcd starts the embedded etcd on 127.0.0.1, waits until it serves, and
// returns it with its client URL.
func startEtcd(dataDir string) (*embed.Etcd, string, error) {
	var prev etcdPorts
	if b, err := os.ReadFile(etcdPortsFile(dataDir)); err == nil {
		_ = json.Unmarshal(b, &prev)
	}

	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		ports := prev
		if attempt > 0 || !portFree(ports.Client) || !portFree(ports.Peer) || ports.Client == ports.Peer {
			var err error
			if ports.Client, err = freePort(); err != nil {
				return nil, "", err
			}
			if ports.Peer, err = freePort(); err != nil {
				return nil, "", err
			}
			if ports.Client == ports.Peer {
				continue
			}
		}
		e, clientURL, err := startEtcdOn(dataDir, ports)
		if err == nil {
			b, _ := json.Marshal(ports)
			if err := writeFileAtomic(etcdPortsFile(dataDir), b, 0o600); err != nil {
				e.Close()
				return nil, "", err
			}
			return e, clientURL, nil
		}
		lastErr = err
		klog.Warningf("etcd did not start on ports %+v (attempt %d): %v", ports, attempt+1, err)
	}
	return nil, "", fmt.Errorf("starting etcd: %w", lastErr)
}

func startEtcdOn(dataDir string, ports etcdPorts) (*embed.Etcd, string, error) {
	clientURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports.Client))}
	peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports.Peer))}

	cfg := embed.NewConfig()
	cfg.Name = "localkube"
	cfg.Dir = filepath.Join(dataDir, "etcd")
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.InitialClusterToken = "localkube"
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	// A test cluster: data must survive the process being killed (the page
	// cache keeps it), not the machine crashing, so skip fsync for speed.
	cfg.UnsafeNoFsync = true
	// Keep fewer raft entries in memory between snapshots.
	cfg.SnapshotCount = 5000
	cfg.SnapshotCatchUpEntries = 1000
	cfg.QuotaBackendBytes = 2 << 30
	cfg.EnableGRPCGateway = false

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, clientURL.String(), nil
	case err := <-e.Err():
		e.Close()
		return nil, "", err
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		e.Close()
		return nil, "", errors.New("etcd took more than 60s to become ready")
	}
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func portFree(port int) bool {
	if port <= 0 {
		return false
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// writeFileAtomic writes data to a temporary file next to path and renames it
// into place, so readers never see a partial file.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

package main

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// collectionsFile, in the data dir, counts the collections SIGUSR1 asked for;
// it is written once each is complete.
const collectionsFile = "garbage-collections"

// collectOnRequest runs a full garbage collection of the whole process
// (etcd, the control plane, the fake node) on every SIGUSR1, then writes how
// many it ran so far to <data-dir>/garbage-collections. A benchmark that times
// its clients against this control plane asks for one before each timed run:
// otherwise whether a run pays for a collection cycle, which on a heap of
// hundreds of MB costs a good part of a CPU-second, depends on what the runs
// before it left behind. Signals that arrive during a collection are
// coalesced into one more collection.
func collectOnRequest(ctx context.Context, dataDir string) {
	requests := make(chan os.Signal, 1)
	signal.Notify(requests, syscall.SIGUSR1)
	defer signal.Stop(requests)
	for count := 1; ; count++ {
		select {
		case <-ctx.Done():
			return
		case <-requests:
		}
		started := time.Now()
		runtime.GC()
		var stats runtime.MemStats
		runtime.ReadMemStats(&stats)
		logf("collected garbage on SIGUSR1 in %v: %d MiB of heap in use",
			time.Since(started).Round(time.Millisecond), stats.HeapAlloc>>20)
		if err := writeCount(filepath.Join(dataDir, collectionsFile), count); err != nil {
			logf("recording the collection: %v", err)
		}
	}
}

// writeCount replaces path with count, atomically: a reader never sees a
// partial number.
func writeCount(path string, count int) error {
	partial := path + ".partial"
	if err := os.WriteFile(partial, []byte(strconv.Itoa(count)+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(partial, path)
}

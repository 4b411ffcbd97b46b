package federation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
)

func TestCredentialsFollowRotatedFilesAndKeepTheLastGoodPair(t *testing.T) {
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	creds := loadCreds(t, ca, dir, "spiffe://fleet.test/old")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go creds.Run(ctx, 10*time.Millisecond)
	identity := func() string {
		cert, _ := creds.current()
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return Identities(leaf)[0]
	}

	if _, err := ca.WriteFiles(dir, "spiffe://fleet.test/new"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "rotated certificate in use", func() error {
		if id := identity(); id != "spiffe://fleet.test/new" {
			return fmt.Errorf("identity %s", id)
		}
		return nil
	})
	// A rotation caught half-way (a key that does not match) is not taken.
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if id := identity(); id != "spiffe://fleet.test/new" {
		t.Fatalf("identity %s after a broken rotation, want the last good one", id)
	}
	if _, err := creds.ServerConfig().GetConfigForClient(&tls.ClientHelloInfo{}); err != nil {
		t.Fatal(err)
	}
}

func TestDirectoryFileReloadsChangesAndKeepsTheLastValidVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "peers.yaml")
	// Replaced whole, as a mounted ConfigMap is: a file read while being
	// rewritten in place could be empty, a valid directory of no peers.
	write := func(s string) {
		if err := os.WriteFile(path+".new", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	write(`peers: [{cluster: west, federationAddress: "127.0.0.1:1", identity: w}]`)
	d := &DirectoryFile{Path: path, Interval: 10 * time.Millisecond, Log: logr.Discard()}
	if err := d.Load(); err != nil {
		t.Fatal(err)
	}
	changed := d.Changed()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = d.Run(ctx) }()

	write(`peers: [{cluster: west, federationAddress: "127.0.0.1:1", identity: w}, {cluster: east, federationAddress: "127.0.0.1:2", identity: e}]`)
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no change notified")
	}
	if n := len(d.Current().Peers); n != 2 {
		t.Fatalf("%d peers after the change, want 2", n)
	}
	write(`peers: [{cluster: "Not A Label"}]`)
	time.Sleep(50 * time.Millisecond)
	if n := len(d.Current().Peers); n != 2 {
		t.Fatalf("%d peers after an invalid change, want the previous 2", n)
	}
}

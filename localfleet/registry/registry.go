// Package registry is the local fleet's OCI registry and image store: a
// registry (go-containerregistry's pkg/registry) served on loopback with its
// blobs on disk, into which the fleet pushes fleetinfer's images at start,
// and a store that pulls an image from it for the host's platform, unpacks
// its layers into a rootfs cached per image digest, and says how to run it.
package registry

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
)

// Server is a registry on a loopback address.
type Server struct {
	srv  *http.Server
	addr string
	done chan struct{}
}

// Serve starts a registry on a free port of 127.0.0.1 that keeps blobs
// under dir (manifests stay in memory: the fleet pushes them at each start).
func Serve(dir string) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{
		srv: &http.Server{Handler: ggcrregistry.New(
			ggcrregistry.WithBlobHandler(ggcrregistry.NewDiskBlobHandler(dir)),
			ggcrregistry.WithReferrersSupport(true),
			ggcrregistry.Logger(log.New(io.Discard, "", 0)),
		), ReadHeaderTimeout: 10 * time.Second},
		addr: ln.Addr().String(),
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Printf("local registry %s: %v", s.addr, err)
		}
	}()
	return s, nil
}

// Addr is the registry's host:port.
func (s *Server) Addr() string { return s.addr }

// Stop closes the registry.
func (s *Server) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	<-s.done
}

package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/pem"
	"io"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// NonRoot is the user every image runs as (distroless's "nonroot").
const (
	NonRootUID = 65532
	NonRoot    = "65532:65532"
	// CACertificates is where the base puts the root certificates, the
	// path Go's crypto/x509 reads first on Linux.
	CACertificates = "/etc/ssl/certs/ca-certificates.crt"
	// BinDir holds each image's binary, its entrypoint.
	BinDir = "/usr/local/bin"
	// SBOMDir holds each image's SPDX document.
	SBOMDir = "/usr/share/sbom"
)

// entry is one file or directory of a layer.
type entry struct {
	name     string
	mode     int64
	uid, gid int
	dir      bool
	data     []byte
}

// layer writes the entries, in order, as a tar with every timestamp at
// created and numeric owners only, so that the same entries always give the
// same bytes, and gzips it.
func layer(entries []entry, created time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: created, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag, h.Name = tar.TypeDir, e.name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// baseEntries is the static, non-root base every image starts from: a root
// and a nonroot user and group, the home of nonroot, a world-writable /tmp,
// and the root certificates of the NSS trust store that the pinned
// golang.org/x/crypto/x509roots/fallback module carries (the same bytes on
// every machine, unlike the host's /etc/ssl/certs). Roots that NSS trusts only
// with a distrust-after date are left out: a PEM bundle cannot carry the
// constraint.
func baseEntries() []entry {
	var certs bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		_ = pem.Encode(&certs, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate})
	}
	dir := func(name string, mode int64) entry { return entry{name: name, mode: mode, dir: true} }
	file := func(name string, data string) entry { return entry{name: name, mode: 0o644, data: []byte(data)} }
	return []entry{
		dir("etc", 0o755),
		file("etc/group", "root:x:0:\nnonroot:x:65532:\n"),
		file("etc/passwd", "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"),
		dir("etc/ssl", 0o755),
		dir("etc/ssl/certs", 0o755),
		{name: CACertificates[1:], mode: 0o644, data: certs.Bytes()},
		dir("home", 0o755),
		{name: "home/nonroot", mode: 0o700, uid: NonRootUID, gid: NonRootUID, dir: true},
		dir("tmp", 0o1777),
	}
}

// binaryEntries put the component's binary and its SBOM into the image.
func binaryEntries(name string, binary, sbom []byte) []entry {
	return []entry{
		{name: "usr", mode: 0o755, dir: true},
		{name: "usr/local", mode: 0o755, dir: true},
		{name: BinDir[1:], mode: 0o755, dir: true},
		{name: BinDir[1:] + "/" + name, mode: 0o755, data: binary},
		{name: "usr/share", mode: 0o755, dir: true},
		{name: SBOMDir[1:], mode: 0o755, dir: true},
		{name: SBOMDir[1:] + "/" + name + ".spdx.json", mode: 0o644, data: sbom},
	}
}

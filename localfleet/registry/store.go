package registry

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/fleetinfer/fleetinfer/internal/ociimage"
)

// Store pulls images through its mirrors and unpacks each into a root
// filesystem under its directory, once per image digest.
type Store struct {
	dir      string
	mirrors  []ociimage.Mirror
	platform v1.Platform

	mu    sync.Mutex
	locks map[string]*sync.Mutex // by image digest
}

// NewStore keeps unpacked images under dir and pulls image references under
// a mirror's From from its To, over plain HTTP (the registry is on loopback).
func NewStore(dir string, mirrors ...ociimage.Mirror) *Store {
	return &Store{dir: dir, mirrors: mirrors, platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH},
		locks: map[string]*sync.Mutex{}}
}

// Dir holds the unpacked images.
func (s *Store) Dir() string { return s.dir }

// Serves reports whether a mirror of the store covers image.
func (s *Store) Serves(image string) bool {
	return slices.ContainsFunc(s.mirrors, func(m ociimage.Mirror) bool { return m.Rewrite(image) != image })
}

// Image is an image pulled and unpacked for the host's platform.
type Image struct {
	// ID is the image as the kubelet reports it in a container status'
	// imageID: the named repository at the digest the reference resolved
	// to in the registry (the index digest for a multi-platform image).
	ID string
	// Digest is that digest.
	Digest string
	// RootFS is the unpacked filesystem.
	RootFS string
	Config v1.Config
}

// Pull resolves image (by tag or digest) through the mirrors, and unpacks
// the host platform's image unless it already is.
func (s *Store) Pull(ctx context.Context, image string) (*Image, error) {
	mirrored := image
	for _, m := range s.mirrors {
		mirrored = m.Rewrite(mirrored)
	}
	ref, err := name.ParseReference(mirrored, name.Insecure)
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(ref, remote.WithContext(ctx), remote.WithPlatform(s.platform))
	if err != nil {
		return nil, fmt.Errorf("pull %s (from %s): %w", image, mirrored, err)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", image, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	named, err := name.ParseReference(image)
	if err != nil {
		return nil, err
	}
	out := &Image{ID: named.Context().Name() + "@" + desc.Digest.String(), Digest: desc.Digest.String(),
		RootFS: filepath.Join(s.dir, digest.Hex, "rootfs")}
	if out.Config, err = s.unpack(img, filepath.Join(s.dir, digest.Hex)); err != nil {
		return nil, fmt.Errorf("unpack %s: %w", image, err)
	}
	return out, nil
}

// unpack extracts img's layers into dir/rootfs and its config into
// dir/config.json, unless an earlier pull did; a partial unpack never
// becomes visible.
func (s *Store) unpack(img v1.Image, dir string) (v1.Config, error) {
	s.mu.Lock()
	l := s.locks[dir]
	if l == nil {
		l = &sync.Mutex{}
		s.locks[dir] = l
	}
	s.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	var cfg v1.Config
	if b, err := os.ReadFile(filepath.Join(dir, "config.json")); err == nil {
		return cfg, json.Unmarshal(b, &cfg)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return cfg, err
	}
	layers, err := img.Layers()
	if err != nil {
		return cfg, err
	}
	tmp := dir + ".tmp"
	_ = os.RemoveAll(tmp)
	for _, layer := range layers {
		rc, err := layer.Uncompressed()
		if err != nil {
			return cfg, err
		}
		err = applyLayer(filepath.Join(tmp, "rootfs"), rc)
		_ = rc.Close()
		if err != nil {
			return cfg, err
		}
	}
	b, err := json.Marshal(cf.Config)
	if err != nil {
		return cfg, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "config.json"), b, 0o644); err != nil {
		return cfg, err
	}
	return cf.Config, os.Rename(tmp, dir)
}

// applyLayer extracts one layer onto root, honouring OCI whiteouts. Owners
// are not applied: the local fleet runs every image as the user it runs as.
func applyLayer(root string, r io.Reader) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		clean := path.Clean(strings.TrimPrefix(h.Name, "/"))
		if clean == "." {
			continue
		}
		if !filepath.IsLocal(clean) {
			return fmt.Errorf("layer entry %q leaves the root", h.Name)
		}
		target := filepath.Join(root, clean)
		dir, base := filepath.Split(target)
		switch {
		case base == ".wh..wh..opq":
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				_ = os.RemoveAll(filepath.Join(dir, e.Name()))
			}
			continue
		case strings.HasPrefix(base, ".wh."):
			_ = os.RemoveAll(filepath.Join(dir, strings.TrimPrefix(base, ".wh.")))
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		mode := os.FileMode(h.Mode).Perm() | os.FileMode(h.Mode)&(os.ModeSticky)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			if err := os.Chmod(target, mode|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			_ = os.RemoveAll(target)
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_EXCL, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			_ = os.RemoveAll(target)
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			old := path.Clean(strings.TrimPrefix(h.Linkname, "/"))
			if !filepath.IsLocal(old) {
				return fmt.Errorf("hard link %q leaves the root", h.Linkname)
			}
			_ = os.RemoveAll(target)
			if err := os.Link(filepath.Join(root, old), target); err != nil {
				return err
			}
		}
	}
}

// Argv is what the container runs, by Kubernetes' rules: a command replaces
// the image's Entrypoint and ignores its Cmd; args alone replace the Cmd.
func (i *Image) Argv(command, args []string) []string {
	switch {
	case len(command) > 0:
		return slices.Concat(command, args)
	case len(args) > 0:
		return slices.Concat(i.Config.Entrypoint, args)
	default:
		return slices.Concat(i.Config.Entrypoint, i.Config.Cmd)
	}
}

// Executable resolves argv[0] inside the root filesystem: an absolute path
// as it is, a bare name through the image's PATH.
func (i *Image) Executable(argv0 string) (string, error) {
	if argv0 == "" {
		return "", errors.New("the image has no entrypoint and the container no command")
	}
	candidates := []string{argv0}
	if !strings.Contains(argv0, "/") {
		candidates = nil
		for _, dir := range filepath.SplitList(i.env("PATH")) {
			candidates = append(candidates, path.Join(dir, argv0))
		}
	}
	for _, c := range candidates {
		if !path.IsAbs(c) {
			continue
		}
		p := filepath.Join(i.RootFS, c)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: no such executable in the image", argv0)
}

// WorkingDir is the image's working directory inside the root filesystem.
func (i *Image) WorkingDir() string {
	return filepath.Join(i.RootFS, path.Clean("/"+i.Config.WorkingDir))
}

func (i *Image) env(key string) string {
	for _, e := range i.Config.Env {
		if k, v, _ := strings.Cut(e, "="); k == key {
			return v
		}
	}
	return ""
}

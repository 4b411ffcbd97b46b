// Package release writes what a fleetinfer release ships besides its
// images: the spoke chart packaged with every image pinned by digest, the
// hub's manifests (CRDs included) with its image pinned the same way, the
// spoke access and the script that registers a spoke, the list of images,
// and a SHA256SUMS file over all of it. Everything is derived from the
// repository and an image layout built at the release's version, and the
// same inputs give the same bytes.
package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/ignore"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/fleetinfer/fleetinfer/internal/ociimage"
)

// Options say what to release and where.
type Options struct {
	// Root is the repository root (deploy/ lives under it).
	Root string
	// Version is the release's version, vMAJOR.MINOR.PATCH[-PRE]; the
	// images must be tagged with it.
	Version string
	// Images is the OCI image layout holding the images at Version.
	Images string
	// Out is the directory the artifacts are written to.
	Out string
	// Created is the modification time of the chart archive's entries.
	Created time.Time
}

// Artifacts are the files Write produced, by role, as paths under Out.
type Artifacts struct {
	Chart, Hub, Register, Sums string
	// Images maps each component to its pinned reference (repository@digest).
	Images map[string]string
}

var versionPattern = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// Write writes the release's artifacts into opts.Out.
func Write(opts Options) (Artifacts, error) {
	if !versionPattern.MatchString(opts.Version) {
		return Artifacts{}, fmt.Errorf("version %q is not vMAJOR.MINOR.PATCH[-PRE]", opts.Version)
	}
	pinned, err := pinnedImages(opts.Images, opts.Version)
	if err != nil {
		return Artifacts{}, err
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return Artifacts{}, err
	}
	a := Artifacts{Images: map[string]string{}}
	for c, d := range pinned {
		a.Images[c] = ociimage.Repository + "/" + c + "@" + d
	}
	deploy := filepath.Join(opts.Root, "deploy")
	chartName := "fleetinfer-spoke"
	chart, err := packageChart(filepath.Join(deploy, "charts", chartName), opts.Version, pinned, opts.Created)
	if err != nil {
		return Artifacts{}, fmt.Errorf("package the spoke chart: %w", err)
	}
	hub, err := hubManifests(filepath.Join(deploy, "hub"), pinned["hub"])
	if err != nil {
		return Artifacts{}, fmt.Errorf("build the hub manifests: %w", err)
	}
	files := map[string][]byte{
		fmt.Sprintf("%s-%s.tgz", chartName, strings.TrimPrefix(opts.Version, "v")): chart,
		"hub.yaml": hub,
		"images.txt": []byte(strings.Join(slices.Collect(func(yield func(string) bool) {
			for _, c := range slices.Sorted(maps.Keys(pinned)) {
				if !yield(ociimage.Reference(c, opts.Version) + "@" + pinned[c]) {
					return
				}
			}
		}), "\n") + "\n"),
	}
	// register-spoke.sh applies spoke-access/ next to it, so both ship as
	// they are in the repository.
	for _, rel := range []string{"register-spoke.sh", "spoke-access/access.yaml", "spoke-access/kustomization.yaml"} {
		if files[rel], err = os.ReadFile(filepath.Join(deploy, "hub", rel)); err != nil {
			return Artifacts{}, err
		}
	}
	var sums bytes.Buffer
	for _, name := range slices.Sorted(maps.Keys(files)) {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		path := filepath.Join(opts.Out, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return Artifacts{}, err
		}
		if err := os.WriteFile(path, files[name], mode); err != nil {
			return Artifacts{}, err
		}
		sum := sha256.Sum256(files[name])
		fmt.Fprintf(&sums, "%s  %s\n", hex.EncodeToString(sum[:]), name)
		switch {
		case strings.HasSuffix(name, ".tgz"):
			a.Chart = path
		case name == "hub.yaml":
			a.Hub = path
		case name == "register-spoke.sh":
			a.Register = path
		}
	}
	a.Sums = filepath.Join(opts.Out, "SHA256SUMS")
	return a, os.WriteFile(a.Sums, sums.Bytes(), 0o644)
}

// pinnedImages maps each component to the digest of its image at version in
// the layout; every component must be there.
func pinnedImages(layout, version string) (map[string]string, error) {
	imgs, err := ociimage.Images(layout)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, c := range ociimage.Components {
		ref := ociimage.Reference(c.Name, version)
		i := slices.IndexFunc(imgs, func(img ociimage.Image) bool { return img.Ref == ref })
		if i < 0 {
			return nil, fmt.Errorf("the image layout %s has no %s (build it with `make images VERSION=%s`)", layout, ref, version)
		}
		out[c.Name] = imgs[i].Digest
	}
	return out, nil
}

// packageChart is `helm package` of dir at version, with the spoke and
// picker images pinned in values.yaml, as a reproducible archive: entries in
// lexical order, one modification time, no owner.
func packageChart(dir, version string, digests map[string]string, created time.Time) ([]byte, error) {
	rules, err := ignore.ParseFile(filepath.Join(dir, ignore.HelmIgnore))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	if rules == nil {
		rules = ignore.Empty()
	}
	rules.AddDefaults()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	base := filepath.Base(dir)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if rules.Ignore(filepath.ToSlash(rel), info) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		switch filepath.ToSlash(rel) {
		case "Chart.yaml":
			data = setChartVersion(data, version)
		case "values.yaml":
			if data, err = pinValues(data, digests["spoke"], digests["epp"]); err != nil {
				return err
			}
		}
		hdr := &tar.Header{Name: base + "/" + filepath.ToSlash(rel), Mode: 0o644, Size: int64(len(data)),
			ModTime: created, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

var (
	chartVersionLine = regexp.MustCompile(`(?m)^version: .*$`)
	appVersionLine   = regexp.MustCompile(`(?m)^appVersion: .*$`)
)

// setChartVersion sets the chart's version (semver, no "v") and appVersion
// (the images' tag), keeping Chart.yaml's comments.
func setChartVersion(chartYAML []byte, version string) []byte {
	out := chartVersionLine.ReplaceAll(chartYAML, []byte("version: "+strings.TrimPrefix(version, "v")))
	return appVersionLine.ReplaceAll(out, []byte("appVersion: "+version))
}

// digestLine is an image's digest value in values.yaml, with its
// indentation: `  digest: ""` for the controller, deeper for the picker.
var digestLine = regexp.MustCompile(`(?m)^( +)digest: ""$`)

// pinValues fills the two image digests of values.yaml in place, keeping its
// comments, and checks the result says what it should.
func pinValues(values []byte, spoke, epp string) ([]byte, error) {
	i := 0
	want := []string{spoke, epp}
	out := digestLine.ReplaceAllFunc(values, func(line []byte) []byte {
		indent := digestLine.FindSubmatch(line)[1]
		i++
		if i > len(want) {
			return line
		}
		return []byte(fmt.Sprintf("%sdigest: %q", indent, want[i-1]))
	})
	var v struct {
		Image struct {
			Digest string `json:"digest"`
		} `json:"image"`
		EPP struct {
			Image struct {
				Digest string `json:"digest"`
			} `json:"image"`
		} `json:"epp"`
	}
	if err := yaml.Unmarshal(out, &v); err != nil {
		return nil, err
	}
	if v.Image.Digest != spoke || v.EPP.Image.Digest != epp {
		return nil, fmt.Errorf(`values.yaml: expected image.digest: "" and then epp.image.digest: ""; pinned %q and %q`, v.Image.Digest, v.EPP.Image.Digest)
	}
	return out, nil
}

// hubManifests is `kustomize build` of the hub's directory with the hub
// image pinned to digest, done on a copy in memory.
func hubManifests(dir, digest string) ([]byte, error) {
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return mem.WriteFile(path, data)
	})
	if err != nil {
		return nil, err
	}
	kfile := filepath.Join(dir, "kustomization.yaml")
	data, err := mem.ReadFile(kfile)
	if err != nil {
		return nil, err
	}
	var k types.Kustomization
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, err
	}
	hubImage := ociimage.Repository + "/hub"
	k.Images = slices.DeleteFunc(k.Images, func(i types.Image) bool { return i.Name == hubImage })
	k.Images = append(k.Images, types.Image{Name: hubImage, Digest: digest})
	if data, err = yaml.Marshal(k); err != nil {
		return nil, err
	}
	if err := mem.WriteFile(kfile, data); err != nil {
		return nil, err
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, dir)
	if err != nil {
		return nil, err
	}
	out, err := m.AsYaml()
	if err != nil {
		return nil, err
	}
	if !bytes.Contains(out, []byte(hubImage+"@"+digest)) {
		return nil, fmt.Errorf("no container runs %s in %s", hubImage, dir)
	}
	return out, nil
}

package release_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"helm.sh/helm/v3/pkg/chart/loader"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/fleetinfer/fleetinfer/deploy/charts"
	"github.com/fleetinfer/fleetinfer/internal/ociimage"
	"github.com/fleetinfer/fleetinfer/internal/release"
)

// imageLayout writes an OCI layout holding a random image index for each
// component at each version and returns it with their digests by reference.
func imageLayout(t *testing.T, versions ...string) (string, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	digests := map[string]string{}
	for _, v := range versions {
		for _, c := range ociimage.Components {
			idx, err := random.Index(64, 1, 2)
			if err != nil {
				t.Fatal(err)
			}
			ref := ociimage.Reference(c.Name, v)
			if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
				t.Fatal(err)
			}
			d, err := idx.Digest()
			if err != nil {
				t.Fatal(err)
			}
			digests[ref] = d.String()
		}
	}
	return dir, digests
}

// root is the repository's root, as an absolute path (kustomize refuses
// relative ones that climb): tests run in their package's directory.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func write(t *testing.T, images, version, out string) release.Artifacts {
	t.Helper()
	a, err := release.Write(release.Options{Root: root(t), Version: version, Images: images, Out: out, Created: time.Unix(0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestTheReleasePinsEveryImageByItsDigest(t *testing.T) {
	images, digests := imageLayout(t, "v0.1.0", "v0.2.0")
	a := write(t, images, "v0.2.0", t.TempDir())
	pinned := func(c string) string {
		return ociimage.Repository + "/" + c + "@" + digests[ociimage.Reference(c, "v0.2.0")]
	}

	ch, err := loader.Load(a.Chart)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Version != "0.2.0" || ch.Metadata.AppVersion != "v0.2.0" {
		t.Errorf("chart version %s, appVersion %s; want 0.2.0 and v0.2.0", ch.Metadata.Version, ch.Metadata.AppVersion)
	}
	if len(ch.Dependencies()) == 0 {
		t.Error("the packaged chart lost its CRD subcharts")
	}
	for _, f := range ch.Raw {
		if strings.HasSuffix(f.Name, "_test.go") {
			t.Errorf("the packaged chart holds %s, which .helmignore leaves out", f.Name)
		}
	}
	objs, err := charts.Render(ch, charts.Options{ReleaseName: "spoke", Namespace: "fleetinfer-system"})
	if err != nil {
		t.Fatal(err)
	}
	var controller string
	var manifests bytes.Buffer
	for _, o := range objs {
		b, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		manifests.Write(b)
		if o.GetKind() == "Deployment" {
			controller = containerImage(t, o)
		}
	}
	if controller != pinned("spoke") {
		t.Errorf("the chart runs the controller from %q, want %q", controller, pinned("spoke"))
	}
	if !bytes.Contains(manifests.Bytes(), []byte(pinned("epp"))) {
		t.Errorf("no preset of the chart names the picker %s", pinned("epp"))
	}
	if bytes.Contains(manifests.Bytes(), []byte(":v0.2.0")) || bytes.Contains(manifests.Bytes(), []byte(digests[ociimage.Reference("epp", "v0.1.0")])) {
		t.Error("the chart still names an image by tag, or another version's digest")
	}

	hub, err := os.ReadFile(a.Hub)
	if err != nil {
		t.Fatal(err)
	}
	hubObjs, err := charts.ParseManifests(hub)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, o := range hubObjs {
		kinds[o.GetKind()]++
		if o.GetKind() == "Deployment" {
			if got := containerImage(t, o); got != pinned("hub") {
				t.Errorf("hub.yaml runs the hub from %q, want %q", got, pinned("hub"))
			}
		}
	}
	if kinds["Deployment"] != 1 || kinds["CustomResourceDefinition"] == 0 || kinds["ClusterRole"] == 0 {
		t.Errorf("hub.yaml holds %v; want the hub Deployment, its CRDs and RBAC", kinds)
	}
	if list, err := os.ReadFile(filepath.Join(filepath.Dir(a.Hub), "images.txt")); err != nil ||
		!strings.Contains(string(list), ociimage.Reference("hub", "v0.2.0")+"@"+digests[ociimage.Reference("hub", "v0.2.0")]) {
		t.Errorf("images.txt %q (%v) does not list the hub's image with its digest", list, err)
	}
}

func containerImage(t *testing.T, o *unstructured.Unstructured) string {
	t.Helper()
	cs, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if err != nil || len(cs) == 0 {
		t.Fatalf("%s %s has no containers (%v)", o.GetKind(), o.GetName(), err)
	}
	img, _, _ := unstructured.NestedString(cs[0].(map[string]any), "image")
	return img
}

func TestTheChecksumsCoverEveryFileAndMatch(t *testing.T) {
	images, _ := imageLayout(t, "v1.0.0")
	out := t.TempDir()
	a := write(t, images, "v1.0.0", out)
	f, err := os.Open(a.Sums)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	listed := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q is not `sum  name`", sc.Text())
		}
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s: checksum %s, file has %x", name, sum, got)
		}
		listed[name] = true
	}
	err = filepath.WalkDir(out, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || path == a.Sums {
			return err
		}
		rel, _ := filepath.Rel(out, path)
		if !listed[filepath.ToSlash(rel)] {
			t.Errorf("%s is not in SHA256SUMS", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hub.yaml", "register-spoke.sh", "spoke-access/access.yaml", "images.txt", "fleetinfer-spoke-1.0.0.tgz"} {
		if !listed[want] {
			t.Errorf("the release has no %s", want)
		}
	}
	if info, err := os.Stat(a.Register); err != nil || info.Mode()&0o111 == 0 {
		t.Errorf("register-spoke.sh is not executable (%v)", err)
	}
}

func TestTheSameInputsGiveTheSameRelease(t *testing.T) {
	images, _ := imageLayout(t, "v0.3.1-rc.1")
	first, second := t.TempDir(), t.TempDir()
	write(t, images, "v0.3.1-rc.1", first)
	write(t, images, "v0.3.1-rc.1", second)
	a, err := os.ReadFile(filepath.Join(first, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(second, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("two releases of the same inputs differ:\n%s\n%s", a, b)
	}
}

func TestAReleaseRefusesWhatItCannotPin(t *testing.T) {
	images, _ := imageLayout(t, "v0.1.0")
	for _, tc := range []struct {
		name, version, want string
	}{
		{"a version that is not semver", "0.2", "is not vMAJOR.MINOR.PATCH"},
		{"images of another version", "v0.2.0", "make images VERSION=v0.2.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := release.Write(release.Options{Root: root(t), Version: tc.version, Images: images, Out: t.TempDir()})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

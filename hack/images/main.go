// Command images builds fleetinfer's OCI images into an image layout
// (`make images`), optionally pushes them to a registry, and with -release
// writes a release next to them (`make release`); see internal/ociimage and
// internal/release.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/fleetinfer/fleetinfer/internal/ociimage"
	"github.com/fleetinfer/fleetinfer/internal/release"
)

func main() {
	out := flag.String("out", "bin/oci", "OCI image layout to write")
	version := flag.String("version", "", "image tag and org.opencontainers.image.version")
	push := flag.String("push", "", "also push every image to this registry prefix (e.g. registry.example.com/fleetinfer), keeping its name and tag")
	insecure := flag.Bool("insecure", false, "push over plain HTTP")
	platforms := flag.String("platforms", "linux/amd64,linux/arm64", "comma-separated os/arch list to build for")
	releaseDir := flag.String("release", "", "also write a release of these images (pinned chart, hub manifests, checksums) to this directory")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var ps []v1.Platform
	for _, p := range strings.Split(*platforms, ",") {
		os, arch, _ := strings.Cut(p, "/")
		ps = append(ps, v1.Platform{OS: os, Architecture: arch})
	}
	if err := run(ctx, *out, *version, ps, *push, *insecure, *releaseDir); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out, version string, platforms []v1.Platform, push string, insecure bool, releaseDir string) error {
	created := time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", s, err)
		}
		created = time.Unix(n, 0).UTC()
	}
	began := time.Now()
	res, err := ociimage.Build(ctx, ociimage.Options{Root: ".", Out: out, Version: version, Created: created, Platforms: platforms})
	if err != nil {
		return err
	}
	state := "built"
	if res.Cached {
		state = "up to date"
	}
	fmt.Printf("%s %s in %.1fs\n", out, state, time.Since(began).Seconds())
	refs := make([]string, 0, len(res.Digests))
	for r := range res.Digests {
		refs = append(refs, r)
	}
	sort.Strings(refs)
	for _, r := range refs {
		fmt.Printf("  %s@%s\n", r, res.Digests[r])
	}
	if releaseDir != "" {
		a, err := release.Write(release.Options{Root: ".", Version: version, Images: out, Out: releaseDir, Created: created})
		if err != nil {
			return err
		}
		fmt.Printf("release %s in %s:\n  %s\n  %s\n  %s\n  %s\n", version, releaseDir, a.Chart, a.Hub, a.Register, a.Sums)
	}
	if push == "" {
		return nil
	}
	pushed, err := ociimage.Push(ctx, out, ociimage.Mirror{From: ociimage.Repository, To: push}, insecure)
	for _, p := range pushed {
		fmt.Println("pushed", p)
	}
	return err
}

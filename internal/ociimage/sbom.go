package ociimage

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// spdxDocument is the part of SPDX 2.3 JSON the images carry: one package per
// Go module linked into the binary, plus the Go standard library, each with
// a purl, and which of them the binary's main module depends on.
type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	SPDXID           string       `json:"SPDXID"`
	Name             string       `json:"name"`
	VersionInfo      string       `json:"versionInfo,omitempty"`
	DownloadLocation string       `json:"downloadLocation"`
	FilesAnalyzed    bool         `json:"filesAnalyzed"`
	Comment          string       `json:"comment,omitempty"`
	ExternalRefs     []spdxExtRef `json:"externalRefs,omitempty"`
	Checksums        []spdxSum    `json:"checksums,omitempty"`
	PrimaryPurpose   string       `json:"primaryPackagePurpose,omitempty"`
}

type spdxExtRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxSum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// SBOM describes a Go binary in SPDX 2.3 JSON from the build information the
// Go linker embeds in it (what `go version -m` prints): its main module, every
// module it links with the version and go.sum hash, the Go toolchain, and the
// build settings. It is deterministic: created is the build's fixed time and
// the namespace is derived from the binary's digest.
func SBOM(image string, binary []byte, created time.Time) ([]byte, error) {
	info, err := buildinfo.Read(bytes.NewReader(binary))
	if err != nil {
		return nil, fmt.Errorf("read Go build information: %w", err)
	}
	sum := sha256.Sum256(binary)
	digest := hex.EncodeToString(sum[:])
	var settings []string
	for _, s := range info.Settings {
		settings = append(settings, s.Key+"="+s.Value)
	}
	mainVersion := info.Main.Version
	main := spdxPackage{
		SPDXID: "SPDXRef-Package-main", Name: info.Path, VersionInfo: mainVersion,
		DownloadLocation: "NOASSERTION", PrimaryPurpose: "APPLICATION",
		Comment:      fmt.Sprintf("main module %s; built with %s; %s", info.Main.Path, info.GoVersion, strings.Join(settings, " ")),
		Checksums:    []spdxSum{{"SHA256", digest}},
		ExternalRefs: []spdxExtRef{purl(info.Main.Path, mainVersion)},
	}
	doc := spdxDocument{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		Name:              image,
		DocumentNamespace: "https://fleetinfer.io/spdx/" + digest,
		CreationInfo:      spdxCreationInfo{Created: created.UTC().Format(time.RFC3339), Creators: []string{"Tool: fleetinfer-ociimage"}},
		Packages: []spdxPackage{main, {
			SPDXID: "SPDXRef-Package-stdlib", Name: "stdlib", VersionInfo: strings.TrimPrefix(info.GoVersion, "go"),
			DownloadLocation: "https://go.dev/dl/", ExternalRefs: []spdxExtRef{purl("stdlib", strings.TrimPrefix(info.GoVersion, "go"))},
		}},
		Relationships: []spdxRelationship{
			{"SPDXRef-DOCUMENT", "DESCRIBES", main.SPDXID},
			{main.SPDXID, "DEPENDS_ON", "SPDXRef-Package-stdlib"},
		},
	}
	for i, d := range info.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		p := spdxPackage{SPDXID: fmt.Sprintf("SPDXRef-Package-%d", i), Name: d.Path, VersionInfo: m.Version,
			DownloadLocation: "https://proxy.golang.org/" + m.Path + "/@v/" + m.Version + ".zip",
			ExternalRefs:     []spdxExtRef{purl(m.Path, m.Version)}}
		if m.Sum != "" {
			p.Comment = "go.sum " + m.Sum
		}
		if d.Replace != nil {
			p.Comment = strings.TrimSpace(fmt.Sprintf("replaced by %s %s; %s", m.Path, m.Version, p.Comment))
		}
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, spdxRelationship{main.SPDXID, "DEPENDS_ON", p.SPDXID})
	}
	return json.MarshalIndent(doc, "", "  ")
}

func purl(path, version string) spdxExtRef {
	loc := "pkg:golang/" + path
	if version != "" && version != "(devel)" {
		loc += "@" + version
	}
	return spdxExtRef{Category: "PACKAGE-MANAGER", Type: "purl", Locator: loc}
}

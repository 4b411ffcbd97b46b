package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// The committed picture is what the generator makes of the committed
// description: edit hack/diagram/architecture.txt and run
// `go run ./hack/diagram` from the repository root.
const source = "hack/diagram/architecture.txt"

func TestTheCommittedArchitectureSVGIsGeneratedFromItsDescription(t *testing.T) {
	src, err := os.ReadFile("architecture.txt")
	if err != nil {
		t.Fatal(err)
	}
	want, err := Render(src, source)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/images/architecture.svg")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("docs/images/architecture.svg is not what hack/diagram/architecture.txt gives: run `go run ./hack/diagram` from the repository root and commit the result")
	}
}

func TestRenderingTheSameDescriptionTwiceGivesTheSameBytes(t *testing.T) {
	src, err := os.ReadFile("architecture.txt")
	if err != nil {
		t.Fatal(err)
	}
	a, err := Render(src, source)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Render(src, source)
	if !bytes.Equal(a, b) {
		t.Fatal("two renderings differ")
	}
}

func TestAPictureWhosePartsOverlapIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
	}{
		{"two boxes on each other", `canvas 400 200
box a 10 10 100 50 data "a"
box b 50 30 100 50 data "b"`, "box b overlaps box a"},
		{"text wider than its box", `canvas 400 200
box a 10 10 60 40 data "a title far too long for it"`, "is 60 wide"},
		{"more lines than the box holds", `canvas 400 200
box a 10 10 200 30 data "one" "two" "three"`, "lines need"},
		{"a box across a group's border", `canvas 400 200
group g 10 10 200 100 "g"
box a 150 60 100 40 data "a"`, "across the border of group g"},
		{"a line through a box", `canvas 400 200
box a 10 10 60 40 data "a"
box b 100 10 60 40 data "b"
box c 200 10 60 40 data "c"
line request -> a.r c.l`, "crosses box b"},
		{"a line through a label", `canvas 400 200
text 100 50 middle label "label"
line request -> 10,46 300,46`, "crosses text"},
		{"labels on each other", `canvas 400 200
text 100 50 start label "one label"
text 110 52 start label "another"`, "overlaps text"},
		{"off the canvas", `canvas 100 100
box a 50 50 100 40 data "a"`, "leaves the canvas"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render([]byte(tc.src), "test")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestARepeatPlacesItsBlockOncePerNameWithItsOffset(t *testing.T) {
	d, err := parse([]byte(`canvas 400 200
repeat a@0,0 b@200,0
box $.x 10 10 100 40 data "$"
line request -> $.x.b 60,120
end`))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.boxes) != 2 || d.boxes[1].id != "b.x" || d.boxes[1].r.x != 210 || d.boxes[1].lines[0] != "b" {
		t.Fatalf("boxes: %+v", d.boxes)
	}
	if p := d.lines[1].points; p[0].x != 260 || p[0].y != 50 || p[1].x != 260 || p[1].y != 120 {
		t.Fatalf("the second line's points: %+v", p)
	}
}

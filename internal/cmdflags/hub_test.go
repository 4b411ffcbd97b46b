package cmdflags

import (
	"flag"
	"testing"
	"time"
)

// The orphan grace defaults to OCM's 60 minutes (a hub restored without
// some services must not delete their copies before anyone notices), and
// --orphan-grace-period still sets it.
func TestTheOrphanGraceDefaultsToAnHour(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{nil, time.Hour},
		{[]string{"--orphan-grace-period=20s"}, 20 * time.Second},
	} {
		var h Hub
		fs := flag.NewFlagSet("hub", flag.ContinueOnError)
		h.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if got := h.Options.OrphanGrace; got != tc.want {
			t.Errorf("%v: orphan grace %s, want %s", tc.args, got, tc.want)
		}
	}
}

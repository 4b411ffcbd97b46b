package epp

import (
	"strings"
	"testing"
	"time"
)

func TestFederationFlagsRefuseAPublishGapPeersWouldThrottle(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(*FederationOptions)
		problem string // in the error; "" for none
	}{
		{name: "the defaults", edit: func(*FederationOptions) {}},
		{name: "no gap", edit: func(o *FederationOptions) { o.PublishMinGap = 0 }, problem: "--federation-publish-min-gap 0s must be positive"},
		{name: "a gap longer than the interval", edit: func(o *FederationOptions) { o.PublishMinGap = time.Second },
			problem: "at most --federation-publish-interval 50ms"},
		{name: "more messages than peers read", edit: func(o *FederationOptions) { o.PublishMinGap = 10 * time.Millisecond },
			problem: "more than the 50 messages a second"},
		{name: "any gap when peers read without bound", edit: func(o *FederationOptions) {
			o.PublishMinGap, o.MaxMessageRate = time.Millisecond, 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewFederationOptions()
			o.PeersFile, o.Cluster, o.CertFile, o.KeyFile, o.CAFile = "peers.yaml", "east", "tls.crt", "tls.key", "ca.crt"
			tc.edit(o)
			err := o.Validate()
			switch {
			case tc.problem == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.problem != "" && (err == nil || !strings.Contains(err.Error(), tc.problem)):
				t.Fatalf("error %v, want one saying %q", err, tc.problem)
			}
		})
	}
}

package v1alpha1

import "testing"

func TestPeerModeIsEndpointOnlyWhenAskedAndThePodNetworkIsShared(t *testing.T) {
	net := func(v string) map[string]string { return map[string]string{"region": "x", PodNetworkLabel: v} }
	none := map[string]string{"region": "x"}
	cases := []struct {
		name  string
		asked FederationMode
		a, b  map[string]string
		want  FederationMode
	}{
		{"Endpoint asked, same pod network", FederationEndpoint, net("mesh"), net("mesh"), FederationEndpoint},
		{"nothing asked is Endpoint", "", net("mesh"), net("mesh"), FederationEndpoint},
		{"Endpoint asked, different pod networks", FederationEndpoint, net("mesh"), net("other"), FederationParent},
		{"Endpoint asked, one cluster unlabelled", FederationEndpoint, net("mesh"), none, FederationParent},
		{"Endpoint asked, the other cluster unlabelled", FederationEndpoint, none, net("mesh"), FederationParent},
		{"Endpoint asked, neither labelled", FederationEndpoint, none, none, FederationParent},
		{"Endpoint asked, both labelled empty", FederationEndpoint, net(""), net(""), FederationParent},
		{"Endpoint asked, no labels at all", FederationEndpoint, nil, nil, FederationParent},
		{"Parent asked, same pod network", FederationParent, net("mesh"), net("mesh"), FederationParent},
		{"Parent asked, no pod network", FederationParent, none, none, FederationParent},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := PeerMode(tc.asked, tc.a, tc.b); got != tc.want {
				t.Errorf("PeerMode(%q, %v, %v) = %s, want %s", tc.asked, tc.a, tc.b, got, tc.want)
			}
			if got := PeerMode(tc.asked, tc.b, tc.a); got != tc.want {
				t.Errorf("PeerMode is not symmetric: with the clusters swapped %s, want %s", got, tc.want)
			}
		})
	}
}

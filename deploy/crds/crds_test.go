package crds

import "testing"

// Every embedded file parses as CRDs, and each group the fleet installs has
// at least one.
func TestThirdPartyCRDsParsePerGroup(t *testing.T) {
	for _, g := range []string{GroupGIE, GroupGIEExperiment, GroupLWS, GroupGateway, GroupClusterInv, GroupOCMCluster, GroupOCMWork, GroupOCMAddon} {
		got, err := ThirdParty(g)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			t.Errorf("no CRDs for group %s", g)
		}
		for _, c := range got {
			if c.Spec.Group != g || len(c.Spec.Versions) == 0 {
				t.Errorf("%s: group %q, %d versions", c.Name, c.Spec.Group, len(c.Spec.Versions))
			}
		}
	}
}

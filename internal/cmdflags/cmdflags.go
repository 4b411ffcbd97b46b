// Package cmdflags holds the command lines of fleetinfer's Go-flag binaries
// (cmd/hub, cmd/spoke, cmd/localfleet): each binary's flags are registered
// by an AddFlags method on a given FlagSet, so that the mains stay thin and
// hack/refdocs can list the same flags the binaries parse. Like the mains,
// it sits above the components it imports (hub, spoke, localfleet): none of
// them may import it.
package cmdflags

// Package federation shares endpoint state between the EPPs of one
// InferencePool in different clusters.
//
// A Publisher serves the Federation gRPC service (v1/federation.proto): it
// compares the local datastore's endpoints every interval and streams a
// snapshot, then deltas and heartbeats, to every authorized subscriber. A
// Subscriber follows the peer directory (apis/fleet/v1alpha1 PeerDirectory, read from a file by
// DirectoryFile) and keeps one stream per peer, reconnecting with backoff;
// what it receives goes through DecodeUpdate and into the Store as GIE
// endpoints carrying an Origin attribute. Readers take the endpoints whose
// data is within the staleness bound; a peer's endpoints leave the Store when
// its stream ends. Peers authenticate each other with mutual TLS
// (Credentials), by the identities listed in the directory.
package federation

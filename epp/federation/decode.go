package federation

import (
	"errors"
	"fmt"
	"math"
	"net/netip"

	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"

	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
)

// Limits bound what one peer can make an EPP hold. A message that breaks one
// is a protocol error: the stream it came on is closed and the peer's
// endpoints are dropped, the EPP itself carries on.
type Limits struct {
	// MaxMessageBytes bounds one encoded Update.
	MaxMessageBytes int
	// MaxEndpoints bounds the endpoints held for one peer.
	MaxEndpoints int
	// MaxMessagesPerSecond and MaxBytesPerSecond bound the rate at which a
	// peer's stream is read, with bursts of twice the messages and of a
	// full message on top of the bytes; what a peer sends faster waits in
	// the peer, held back by the stream's flow control. Zero does not bound.
	MaxMessagesPerSecond int
	MaxBytesPerSecond    int
}

// DefaultLimits allow a peer 4,096 endpoints in messages of at most 4 MiB; a
// full snapshot of 4,096 endpoints with a dozen labels each is about 1.5 MiB.
// A publisher sends a message per --federation-publish-interval (50 ms: 20
// a second), or, while the requests its picker sends start and end, up to
// one per --federation-publish-min-gap (25 ms: 40 a second), a few KiB each
// in steady state; the message rate allows 50, no more, since every message
// costs the receiver a pass over the peer's endpoints.
var DefaultLimits = Limits{MaxMessageBytes: 4 << 20, MaxEndpoints: 4096, MaxMessagesPerSecond: 50, MaxBytesPerSecond: 8 << 20}

// rateLimiters return the limiters of a stream's messages and bytes; nil
// where Limits do not bound.
func (l Limits) rateLimiters() (messages, bytes *rate.Limiter) {
	if l.MaxMessagesPerSecond > 0 {
		messages = rate.NewLimiter(rate.Limit(l.MaxMessagesPerSecond), 2*l.MaxMessagesPerSecond)
	}
	if l.MaxBytesPerSecond > 0 {
		bytes = rate.NewLimiter(rate.Limit(l.MaxBytesPerSecond), l.MaxBytesPerSecond+l.MaxMessageBytes)
	}
	return messages, bytes
}

// Per-endpoint bounds, from Kubernetes' own limits where one exists. They
// are shared: the decoder refuses a message that breaks them, the publisher
// leaves out what would (publishable, adapters), so that one odd pod costs
// its own endpoint rather than the whole pool's stream.
const (
	maxNameLen       = 253 // DNS subdomain
	maxLabels        = 64
	maxLabelKeyLen   = 253 + 1 + 63 // prefix/name
	maxLabelValueLen = 63
	maxAdapters      = 256
	maxAdapterLen    = 256
)

// DecodeUpdate parses one Update and checks everything that can be checked
// without the stream's state. It is the only way the subscriber turns bytes
// from a peer into an Update.
func DecodeUpdate(b []byte, limits Limits) (*federationv1.Update, error) {
	u := &federationv1.Update{}
	if err := decodeInto(b, u, limits); err != nil {
		return nil, err
	}
	return u, nil
}

func decodeInto(b []byte, u *federationv1.Update, limits Limits) error {
	if len(b) > limits.MaxMessageBytes {
		return fmt.Errorf("update of %d bytes exceeds the limit of %d", len(b), limits.MaxMessageBytes)
	}
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, u); err != nil {
		return fmt.Errorf("malformed update: %w", err)
	}
	return ValidateUpdate(u, limits)
}

// ValidateUpdate checks an Update's fields and bounds.
func ValidateUpdate(u *federationv1.Update, limits Limits) error {
	if u.GetSeq() == 0 {
		return errors.New("update without sequence number")
	}
	if u.GetSentUnixNano() <= 0 {
		return errors.New("update without send time")
	}
	if n := len(u.GetUpserts()) + len(u.GetRemoved()) + len(u.GetLagging()); n > 3*limits.MaxEndpoints {
		return fmt.Errorf("update lists %d endpoints, more than a peer may have", n)
	}
	seen := make(map[uint32]bool, len(u.GetUpserts()))
	for _, e := range u.GetUpserts() {
		if seen[e.GetId()] {
			return fmt.Errorf("endpoint %d upserted twice", e.GetId())
		}
		seen[e.GetId()] = true
		if err := validateEndpoint(e); err != nil {
			return fmt.Errorf("endpoint %d: %w", e.GetId(), err)
		}
	}
	for _, id := range u.GetRemoved() {
		if seen[id] {
			return fmt.Errorf("endpoint %d both upserted and removed", id)
		}
	}
	return nil
}

// checkNamesAndLabels checks an endpoint's names and labels against the
// per-endpoint bounds.
func checkNamesAndLabels(name, podName string, labels map[string]string) error {
	if name == "" || len(name) > maxNameLen || len(podName) > maxNameLen {
		return errors.New("endpoint name missing or too long")
	}
	if len(labels) > maxLabels {
		return fmt.Errorf("%d labels, at most %d", len(labels), maxLabels)
	}
	for k, v := range labels {
		if k == "" || len(k) > maxLabelKeyLen || len(v) > maxLabelValueLen {
			return fmt.Errorf("label %.40q is empty or too long", k)
		}
	}
	return nil
}

// validAdapterName reports whether a LoRA adapter name is within bounds.
func validAdapterName(name string) bool { return name != "" && len(name) <= maxAdapterLen }

func validateEndpoint(e *federationv1.Endpoint) error {
	if s := e.GetSpec(); s != nil {
		if err := checkNamesAndLabels(s.GetName(), s.GetPodName(), s.GetLabels()); err != nil {
			return err
		}
		addr, err := netip.ParseAddr(s.GetAddress())
		if err != nil || addr.Zone() != "" {
			return fmt.Errorf("address %q is not an IP address", s.GetAddress())
		}
		if s.GetPort() == 0 || s.GetPort() > math.MaxUint16 {
			return fmt.Errorf("port %d out of range", s.GetPort())
		}
	}
	m := e.GetMetrics()
	if m == nil {
		return errors.New("endpoint without metrics")
	}
	if kv := m.GetKvCacheUsage(); math.IsNaN(kv) || kv < 0 || kv > 1 {
		return fmt.Errorf("KV-cache usage %v is not a fraction", kv)
	}
	if m.GetScrapeUnixNano() < 0 {
		return errors.New("negative scrape time")
	}
	if l := m.GetLora(); l != nil {
		if l.GetMaxAdapters() < 0 || len(l.GetRunning()) > maxAdapters || len(l.GetWaiting()) > maxAdapters {
			return errors.New("LoRA state out of bounds")
		}
		for _, adapters := range []map[string]uint32{l.GetRunning(), l.GetWaiting()} {
			for name := range adapters {
				if !validAdapterName(name) {
					return fmt.Errorf("LoRA adapter name %.40q is empty or too long", name)
				}
			}
		}
	}
	return nil
}

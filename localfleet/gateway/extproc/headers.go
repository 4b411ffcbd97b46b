package extproc

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http/httpguts"
)

// header is one entry of a header map as Envoy holds it: lower-case key,
// one entry per value, pseudo-headers (":method", ":status") included.
type header struct{ key, value string }

// headers is an ordered multimap with Envoy's header-map semantics.
type headers []header

func (h headers) get(key string) (string, bool) {
	for _, e := range h {
		if e.key == key {
			return e.value, true
		}
	}
	return "", false
}

func (h *headers) del(key string) {
	out := (*h)[:0]
	for _, e := range *h {
		if e.key != key {
			out = append(out, e)
		}
	}
	*h = out
}

func (h *headers) add(key, value string) { *h = append(*h, header{key, value}) }

// set replaces every value of key, keeping the position of the first one,
// as Envoy's HeaderMap::setCopy does.
func (h *headers) set(key, value string) {
	for i, e := range *h {
		if e.key == key {
			(*h)[i].value = value
			rest := (*h)[i+1:]
			rest.del(key)
			*h = (*h)[:i+1+len(rest)]
			return
		}
	}
	h.add(key, value)
}

// fromHTTP appends an http.Header, lower-casing keys, one entry per value.
func (h *headers) fromHTTP(hdr http.Header) {
	for k, vs := range hdr {
		k = strings.ToLower(k)
		for _, v := range vs {
			h.add(k, v)
		}
	}
}

// http returns the regular (non-pseudo) headers as an http.Header.
func (h headers) http() http.Header {
	out := make(http.Header, len(h))
	for _, e := range h {
		if !strings.HasPrefix(e.key, ":") {
			out.Add(e.key, e.value)
		}
	}
	return out
}

// proto renders the map as Envoy sends it with the send_header_raw_value
// feature on (the default since Envoy 1.29): the value goes in raw_value.
func (h headers) proto() *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, len(h))}
	for i, e := range h {
		m.Headers[i] = &corev3.HeaderValue{Key: e.key, RawValue: []byte(e.value)}
	}
	return m
}

// fromProto reads a header map sent by a processor, e.g. in an immediate
// response; raw_value wins over value as in Envoy.
func fromProto(m *corev3.HeaderMap) headers {
	var h headers
	for _, e := range m.GetHeaders() {
		h.add(strings.ToLower(e.GetKey()), headerValue(e))
	}
	return h
}

func headerValue(v *corev3.HeaderValue) string {
	if len(v.GetRawValue()) > 0 {
		return string(v.GetRawValue())
	}
	return v.GetValue()
}

// direction selects which mutation rules apply.
type direction int

const (
	requestHeaders direction = iota
	responseHeaders
)

// mutable reports whether Envoy's default HeaderMutationRules let a processor
// set or remove key: never an "x-envoy-" header, never host, :authority,
// :scheme or :method (they steer later filters); among pseudo-headers only
// :path on requests and :status on responses may be set, and none removed.
func mutable(d direction, key string, remove bool) bool {
	switch {
	case strings.HasPrefix(key, "x-envoy-"), key == "host":
		return false
	case strings.HasPrefix(key, ":"):
		if remove {
			return false
		}
		return (d == requestHeaders && key == ":path") || (d == responseHeaders && key == ":status")
	}
	return true
}

// apply applies a processor's header mutation the way Envoy's ext_proc filter
// does (mutation_utils.cc): removals first, then sets. A set without an
// explicit append action overwrites unless the deprecated append flag says
// otherwise. Mutations the default rules forbid are skipped and counted;
// malformed names or values fail the whole mutation, as Envoy fails the
// stream.
func (h *headers) apply(d direction, m *extprocv3.HeaderMutation) (rejected int, err error) {
	for _, k := range m.GetRemoveHeaders() {
		k = strings.ToLower(k)
		if !httpguts.ValidHeaderFieldName(strings.TrimPrefix(k, ":")) {
			return rejected, protocolErrorf("invalid header name %q in remove_headers", k)
		}
		if !mutable(d, k, true) {
			rejected++
			continue
		}
		h.del(k)
	}
	for _, o := range m.GetSetHeaders() {
		if o.GetHeader() == nil {
			continue
		}
		k, v := strings.ToLower(o.GetHeader().GetKey()), headerValue(o.GetHeader())
		if !httpguts.ValidHeaderFieldName(strings.TrimPrefix(k, ":")) || !httpguts.ValidHeaderFieldValue(v) {
			return rejected, protocolErrorf("invalid header %q: %q in set_headers", k, v)
		}
		if !mutable(d, k, false) || (k == ":status" && !validStatus(v)) {
			rejected++
			continue
		}
		_, exists := h.get(k)
		switch o.GetAppendAction() {
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !exists {
				h.add(k, v)
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			h.set(k, v)
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if exists {
				h.set(k, v)
			}
		default: // APPEND_IF_EXISTS_OR_ADD is the zero value: Envoy reads the legacy flag instead.
			if o.GetAppend().GetValue() {
				h.add(k, v)
			} else {
				h.set(k, v)
			}
		}
	}
	return rejected, nil
}

func validStatus(v string) bool {
	code, err := strconv.Atoi(v)
	return err == nil && code >= 200 && code <= 599
}

// ProtocolError is a processor answer that breaks the ext-proc or Endpoint
// Picker protocol: a message out of order, a body mutation FULL_DUPLEX_STREAMED
// does not allow, or a destination header and metadata that disagree.
type ProtocolError struct{ msg string }

func (e *ProtocolError) Error() string { return "ext-proc protocol violation: " + e.msg }

func protocolErrorf(format string, args ...any) error {
	return &ProtocolError{msg: fmt.Sprintf(format, args...)}
}

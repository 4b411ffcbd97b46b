package main

import (
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"
)

// skyProxy is the data path of SkyServe's load balancer. SkyServe's load
// balancer is an HTTP proxy (sky/serve/load_balancer.py: a FastAPI app that
// sends each request on to the replica its policy picked with an httpx
// client and streams the response back), so every request and every
// streamed chunk passes through that process on top of the gateway and
// picker of the cluster picked. The policy (skyServe.route) runs in the
// load client, which names the replica picked in upstreamHeader; this
// proxy forwards the request there, keeping its Host (the pool's route),
// and flushes every chunk as it arrives. Like SkyServe's (content=await
// request.body() in _proxy_request_to), it reads the whole request body
// before it sends the request on. Streaming it instead would race Go's
// server, which reads out what is left of a request's body once the
// response begins, against the transport still sending that body
// upstream: the transport's read then fails, and it drops the upstream
// connection mid-response.
//
// A Go reverse proxy in the benchmark's process passes a request for less
// CPU than SkyServe's Python one: what the pass costs here is a lower bound
// of what it costs SkyServe. Its connections to the gateways are kept as
// SkyServe's are (httpxLimits), no longer.
type skyProxy struct {
	url string
	srv *http.Server
	// opened counts the connections dialed to the gateways.
	opened atomic.Int64
}

// httpxLimits are the connection limits of SkyServe's load balancer: it
// holds one httpx.AsyncClient per ready replica, made with only its
// base_url (sky/serve/load_balancer.py, _sync_with_controller), so each
// has httpx's default Limits: at most 100 connections, 20 kept idle, and
// an idle one closed after 5 s (keepalive_expiry). A replica here is a
// cluster's gateway, across a link from the load balancer's region, so a
// connection opened after a quiet 5 s pays a handshake over the link.
var httpxLimits = struct {
	maxConns, maxIdle int
	keepaliveExpiry   time.Duration
}{maxConns: 100, maxIdle: 20, keepaliveExpiry: 5 * time.Second}

const (
	// maxRequestBody bounds a request's body, which the proxy holds whole:
	// the benchmark's prompts are a few KiB.
	maxRequestBody = 1 << 20
	// upstreamHeader names the gateway the load balancer's policy picked.
	upstreamHeader = "X-Bench-Sky-Upstream"
	// connectErrorHeader marks an answer the proxy gave because the
	// upstream could not be reached, before any response: the error
	// SkyServe's load balancer retries (LB_MAX_RETRY).
	connectErrorHeader = "X-Bench-Sky-Connect-Error"
)

// startSkyProxy starts the proxy on a loopback port; it closes a connection
// to a gateway once idle for keepaliveExpiry.
func startSkyProxy(keepaliveExpiry time.Duration) (*skyProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &skyProxy{url: "http://" + ln.Addr().String()}
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The server's handler has checked the header before.
			u, _ := url.Parse(pr.In.Header.Get(upstreamHeader))
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del(upstreamHeader)
		},
		Transport: &http.Transport{MaxConnsPerHost: httpxLimits.maxConns, MaxIdleConnsPerHost: httpxLimits.maxIdle,
			IdleConnTimeout: keepaliveExpiry, DisableCompression: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := dialer.DialContext(ctx, network, addr)
				if err == nil {
					p.opened.Add(1)
				}
				return c, err
			}},
		// Server-sent events pass chunk by chunk.
		FlushInterval: -1,
		// A stream cut short (a cluster lost mid-response) is the client's
		// error to record, not a line in the benchmark's output.
		ErrorLog: log.New(io.Discard, "", 0),
		// The transport failed before any response arrived.
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			w.Header().Set(connectErrorHeader, "1")
			http.Error(w, "load balancer: "+err.Error(), http.StatusBadGateway)
		},
	}
	p.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := url.Parse(r.Header.Get(upstreamHeader))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			http.Error(w, "load balancer: "+upstreamHeader+" must name an http(s) URL", http.StatusBadRequest)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
		if err != nil {
			http.Error(w, "load balancer: reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(body)), int64(len(body)), nil
		rp.ServeHTTP(w, r)
	})}
	// Serve returns when close closes the listener.
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// close stops the proxy and the streams passing through it.
func (p *skyProxy) close() { _ = p.srv.Close() }

package gateway

import (
	"sync"

	"github.com/fleetinfer/fleetinfer/localfleet/gateway/extproc"
)

// eppClients keeps one ext-proc client (one HTTP/2 connection) per
// endpoint-picker address. A client whose address left the configuration is
// closed once no request uses it any more.
type eppClients struct {
	opts    []extproc.Option
	mu      sync.Mutex
	clients map[string]*eppClient
}

type eppClient struct {
	*extproc.Client
	users int
	stale bool
}

func newEPPClients(opts ...extproc.Option) *eppClients {
	return &eppClients{opts: opts, clients: map[string]*eppClient{}}
}

// get returns the client for addr; call release when the exchange is over.
func (p *eppClients) get(addr string) (c *extproc.Client, release func(), err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ec := p.clients[addr]
	if ec == nil {
		cl, err := extproc.Dial(addr, p.opts...)
		if err != nil {
			return nil, nil, err
		}
		ec = &eppClient{Client: cl}
		p.clients[addr] = ec
	}
	ec.users++
	return ec.Client, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		ec.users--
		if ec.stale && ec.users == 0 {
			_ = ec.Close()
		}
	}, nil
}

// prune closes the clients of addresses not in keep, now or when their last
// exchange ends.
func (p *eppClients) prune(keep map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, ec := range p.clients {
		if keep[addr] {
			continue
		}
		delete(p.clients, addr)
		ec.stale = true
		if ec.users == 0 {
			_ = ec.Close()
		}
	}
}

func (p *eppClients) closeAll() { p.prune(nil) }

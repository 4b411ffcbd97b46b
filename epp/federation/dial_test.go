package federation

import (
	"context"
	"net"
	"testing"
	"time"
)

func TestSubscriptionsDialFromTheConfiguredSourceAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct{ source, want string }{
		{source: "127.0.0.2", want: "127.0.0.2"},
		{source: "", want: "127.0.0.1"},
	} {
		s := NewSubscriber(SubscriberOptions{SourceAddress: tc.source})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := s.dial(ctx, ln.Addr().String())
		cancel()
		if err != nil {
			t.Fatalf("source %q: %v", tc.source, err)
		}
		in, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if got := in.RemoteAddr().(*net.TCPAddr).IP.String(); got != tc.want {
			t.Errorf("source %q: the peer saw the connection from %s, want %s", tc.source, got, tc.want)
		}
		in.Close()
		c.Close()
	}
}

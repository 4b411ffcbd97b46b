package kubelet

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var probeHTTP = &http.Client{
	Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the kubelet does not verify probe targets either
		DisableKeepAlives: true,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// runProbe performs one probe against the pod address, as the kubelet does:
// an HTTP status in [200,400), an accepted TCP connection, or a SERVING gRPC
// health answer. Exec probes cannot run without the image, so they pass.
func runProbe(ctx context.Context, p *corev1.Probe, c *corev1.Container, podIP string) error {
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.HTTPGet != nil:
		port, err := resolvePort(p.HTTPGet.Port, c)
		if err != nil {
			return err
		}
		scheme := "http"
		if p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		host := podIP
		if p.HTTPGet.Host != "" {
			host = p.HTTPGet.Host
		}
		url := scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port)) + p.HTTPGet.Path
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		for _, h := range p.HTTPGet.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		resp, err := probeHTTP.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
		}
		return nil
	case p.TCPSocket != nil:
		port, err := resolvePort(p.TCPSocket.Port, c)
		if err != nil {
			return err
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(podIP, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case p.GRPC != nil:
		conn, err := grpc.NewClient(net.JoinHostPort(podIP, strconv.Itoa(int(p.GRPC.Port))),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		service := ""
		if p.GRPC.Service != nil {
			service = *p.GRPC.Service
		}
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			return err
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("gRPC health status %s", resp.GetStatus())
		}
		return nil
	}
	return nil
}

func resolvePort(p intstr.IntOrString, c *corev1.Container) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.Name, p.StrVal)
}

// Copied from GIE v1.5.0: the gRPC servers its runner starts through its
// internal packages (internal/runnable/grpc.go,
// internal/runnable/leader_election.go, internal/tls/tls.go), the ext-proc
// server's runnable (pkg/epp/server/runserver.go) and its unexported health
// service (cmd/epp/runner/health.go), which cannot be imported from outside
// GIE; changes are marked "fleetinfer:". See the package doc.

package gierunner

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"sync/atomic"
	"time"

	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthPb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"
	backendmetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/backend/metrics"
	datalayerlogger "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer/logger"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	runserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"
)

// NoLeaderElection marks r to run on every replica, not only the leader
// (internal/runnable/leader_election.go).
func NoLeaderElection(r manager.Runnable) manager.Runnable { return noLeaderElection{r} }

type noLeaderElection struct{ manager.Runnable }

func (noLeaderElection) NeedLeaderElection() bool { return false }

// GRPCServer serves srv on every interface at port until ctx ends
// (internal/runnable/grpc.go).
//
// fleetinfer: it logs only that the server listens, and names the server in
// its errors.
func GRPCServer(name string, srv *grpc.Server, port int) manager.Runnable {
	return manager.RunnableFunc(func(ctx context.Context) error {
		log := ctrl.Log.WithValues("name", name)
		lis, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			return fmt.Errorf("gRPC server %s failed to listen - %w", name, err)
		}
		log.Info("gRPC server listening", "port", port)
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-ctx.Done():
				srv.GracefulStop()
			case <-done:
			}
		}()
		if err := srv.Serve(lis); err != nil && err != grpc.ErrServerStopped {
			return fmt.Errorf("gRPC server %s failed - %w", name, err)
		}
		return nil
	})
}

// extProcRunnable is ExtProcServerRunner.AsRunnable
// (pkg/epp/server/runserver.go).
//
// fleetinfer: it serves svc, with the server options opts; GIE's builds a
// StreamingServer around r's concrete Director, on a server without limits.
func extProcRunnable(r *runserver.ExtProcServerRunner, svc extProcPb.ExternalProcessorServer, opts []grpc.ServerOption) manager.Runnable {
	return NoLeaderElection(manager.RunnableFunc(func(ctx context.Context) error {
		if r.UseExperimentalDatalayerV2 {
			datalayerlogger.StartMetricsLogger(ctx, r.Datastore, r.RefreshPrometheusMetricsInterval, r.MetricsStalenessThreshold)
		} else {
			backendmetrics.StartMetricsLogger(ctx, r.Datastore, r.RefreshPrometheusMetricsInterval, r.MetricsStalenessThreshold)
		}
		if r.SecureServing {
			creds, err := servingCredentials(ctx, r.CertPath, r.EnableCertReload)
			if err != nil {
				return err
			}
			opts = append(opts, grpc.Creds(creds))
		}
		srv := grpc.NewServer(opts...)
		extProcPb.RegisterExternalProcessorServer(srv, svc)
		if r.HealthChecking {
			hc := health.NewServer()
			healthPb.RegisterHealthServer(srv, hc)
			hc.SetServingStatus(extProcPb.ExternalProcessor_ServiceDesc.ServiceName, healthPb.HealthCheckResponse_SERVING)
		}
		return GRPCServer("ext-proc", srv, r.GrpcPort).Start(ctx)
	}))
}

// servingCredentials are the ext-proc server's TLS credentials: the pair in
// certPath (tls.crt, tls.key), optionally reloaded, else a self-signed one
// (AsRunnable's TLS setup).
func servingCredentials(ctx context.Context, certPath string, reload bool) (credentials.TransportCredentials, error) {
	if certPath == "" {
		cert, err := selfSignedCertificate()
		if err != nil {
			return nil, err
		}
		return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}), nil
	}
	cert, err := tls.LoadX509KeyPair(certPath+"/tls.crt", certPath+"/tls.key")
	if err != nil {
		return nil, err
	}
	if !reload {
		return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}), nil
	}
	reloader, err := common.NewCertReloader(ctx, certPath, &cert)
	if err != nil {
		return nil, fmt.Errorf("failed to create cert reloader: %w", err)
	}
	return credentials.NewTLS(&tls.Config{NextProtos: []string{"h2"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return reloader.Get(), nil }}), nil
}

// selfSignedCertificate is CreateSelfSignedTLSCertificate
// (internal/tls/tls.go).
//
// fleetinfer: an ECDSA P-256 key, where GIE's is RSA 4096, which takes
// seconds to generate.
func selfSignedCertificate() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{Organization: []string{"Inference Ext"}},
		NotBefore: now, NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// addHealthServer is registerHealthServer (cmd/epp/runner/runner.go).
func addHealthServer(mgr manager.Manager, ds datastore.Datastore, port int, isLeader *atomic.Bool, leaderElection bool) error {
	srv := grpc.NewServer()
	healthPb.RegisterHealthServer(srv, &healthServer{ds: ds, isLeader: isLeader, leaderElection: leaderElection})
	return mgr.Add(NoLeaderElection(GRPCServer("health", srv, port)))
}

// healthServer answers like GIE's (cmd/epp/runner/health.go): serving once
// the pool is synced and, with leader election, on the leader only.
//
// fleetinfer: without GIE's log line per check.
type healthServer struct {
	healthPb.UnimplementedHealthServer
	ds             datastore.Datastore
	isLeader       *atomic.Bool
	leaderElection bool
}

func (s *healthServer) Check(_ context.Context, in *healthPb.HealthCheckRequest) (*healthPb.HealthCheckResponse, error) {
	live := s.ds.PoolHasSynced()
	serving := live
	if s.leaderElection {
		switch in.GetService() {
		case "liveness":
			serving = true
		case "readiness", "", extProcPb.ExternalProcessor_ServiceDesc.ServiceName:
			serving = live && s.isLeader.Load()
		default:
			return &healthPb.HealthCheckResponse{Status: healthPb.HealthCheckResponse_SERVICE_UNKNOWN}, nil
		}
	}
	if !serving {
		return &healthPb.HealthCheckResponse{Status: healthPb.HealthCheckResponse_NOT_SERVING}, nil
	}
	return &healthPb.HealthCheckResponse{Status: healthPb.HealthCheckResponse_SERVING}, nil
}

func (s *healthServer) List(ctx context.Context, _ *healthPb.HealthListRequest) (*healthPb.HealthListResponse, error) {
	services := []string{extProcPb.ExternalProcessor_ServiceDesc.ServiceName}
	if s.leaderElection {
		services = append(services, "liveness", "readiness")
	}
	out := &healthPb.HealthListResponse{Statuses: map[string]*healthPb.HealthCheckResponse{}}
	for _, svc := range services {
		resp, _ := s.Check(ctx, &healthPb.HealthCheckRequest{Service: svc})
		out.Statuses[svc] = resp
	}
	return out, nil
}

func (s *healthServer) Watch(*healthPb.HealthCheckRequest, healthPb.Health_WatchServer) error {
	return status.Error(codes.Unimplemented, "Watch is not implemented")
}

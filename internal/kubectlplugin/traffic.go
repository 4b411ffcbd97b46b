package kubectlplugin

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/httpget"
)

// The endpoint picker's metrics the traffic view reads (epp/metrics.go).
const (
	// picksMetric counts scheduled requests by locality ("local",
	// "remote") and, for remote picks, the cluster served in.
	picksMetric = "fleetinfer_epp_picks_total"
	// parentMarksMetric counts requests by their Parent-mode marks; the
	// "accepted" ones were forwarded by another cluster's picker and are
	// counted as local picks here, though they entered elsewhere.
	parentMarksMetric = "fleetinfer_epp_parent_marks_total"
	// metricsPortName is the picker container's port that serves
	// /metrics.
	metricsPortName = "metrics"
)

func trafficCommand(o *options) *cobra.Command {
	var contexts map[string]string
	cmd := &cobra.Command{
		Use: "traffic",
		Short: "Per service and cluster, the share of the requests entering there that its endpoint picker sent to local pods and to each other cluster " +
			"(read from each picker's metrics through its cluster's API server)",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hub, ns, err := o.hub(true)
			if err != nil {
				return err
			}
			raw, err := o.flags.ToRawKubeConfigLoader().RawConfig()
			if err != nil {
				return err
			}
			connect := func(cluster string) (kubernetes.Interface, error) {
				name := cluster
				if c, ok := contexts[cluster]; ok {
					name = c
				}
				if _, ok := raw.Contexts[name]; !ok {
					return nil, fmt.Errorf("no kubeconfig context %q (name one with --cluster-context %s=CONTEXT)", name, cluster)
				}
				cfg, err := clientcmd.NewNonInteractiveClientConfig(raw, name, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
				if err != nil {
					return nil, err
				}
				return kubernetes.NewForConfig(rest.CopyConfig(cfg))
			}
			return Traffic(cmd.Context(), hub, connect, ns, o.streams.Out)
		},
	}
	cmd.Flags().StringToStringVar(&contexts, "cluster-context", nil,
		"kubeconfig context of a member cluster, CLUSTER=CONTEXT (default: the context named after the cluster)")
	return cmd
}

// Counts are one picker's requests: the ones that entered its cluster,
// by the cluster that served them ("" for local pods).
type Counts struct {
	Entered  float64
	ServedIn map[string]float64
}

// PickerCounts reads a picker's metrics (Prometheus text): every pick,
// less the picks of requests another cluster's picker forwarded here
// (Parent mode), which entered elsewhere.
func PickerCounts(text []byte) (Counts, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return Counts{}, err
	}
	c := Counts{ServedIn: map[string]float64{}}
	if f := families[picksMetric]; f != nil {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			served := labels["cluster"]
			if labels["locality"] == "local" {
				served = ""
			}
			c.ServedIn[served] += value(m)
			c.Entered += value(m)
		}
	}
	if f := families[parentMarksMetric]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "accepted" {
					c.ServedIn[""] -= value(m)
					c.Entered -= value(m)
				}
			}
		}
	}
	return c, nil
}

// value is a counter's value, also when the endpoint left out its type.
func value(m *dto.Metric) float64 {
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetUntyped().GetValue()
}

// Traffic prints, for every endpoint picker in every member cluster (in ns,
// "" for all), how many requests entered the cluster and where they were
// served. connect returns a client of a member cluster; the pickers'
// metrics are read through the cluster's API server (the pod proxy), which
// works wherever the caller may proxy to pods, whatever the pod network.
func Traffic(ctx context.Context, hub client.Client, connect func(cluster string) (kubernetes.Interface, error), ns string, out io.Writer) error {
	var members fleetv1alpha1.MemberClusterList
	if err := hub.List(ctx, &members); err != nil {
		return fmt.Errorf("member clusters: %w", err)
	}
	type row struct {
		service, cluster string
		counts           Counts
		err              error
	}
	var rows []row
	var failed []string
	for _, m := range members.Items {
		cs, err := connect(m.Name)
		if err == nil {
			var pickers []pickerCounts
			pickers, err = scrapePickers(ctx, cs, ns)
			for _, p := range pickers {
				rows = append(rows, row{service: p.service, cluster: m.Name, counts: p.counts, err: p.err})
			}
		}
		if err != nil {
			rows = append(rows, row{cluster: m.Name, err: err})
			failed = append(failed, m.Name)
		}
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].service != rows[j].service {
			return rows[i].service < rows[j].service
		}
		return rows[i].cluster < rows[j].cluster
	})
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tENTERED AT\tREQUESTS\tSERVED LOCALLY\tSERVED IN OTHER CLUSTERS")
	for _, r := range rows {
		if r.err != nil {
			fmt.Fprintf(tw, "%s\t%s\t?\t?\t%v\n", orDash(r.service), r.cluster, r.err)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\n", r.service, r.cluster, r.counts.Entered, share(r.counts.ServedIn[""], r.counts.Entered), elsewhere(r.counts))
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(no endpoint pickers)\t\t\t\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("could not read the pickers of %s", strings.Join(failed, ", "))
	}
	return nil
}

type pickerCounts struct {
	service string
	counts  Counts
	err     error
}

// scrapePickers reads the metrics of every running endpoint picker pod in
// ns of one cluster through the API server's pod proxy, summed per service.
// An API server refuses to proxy to a loopback pod address; such an
// address belongs to a pod on this very machine (the local fleet), so it is
// read directly.
func scrapePickers(ctx context.Context, cs kubernetes.Interface, ns string) ([]pickerCounts, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: v1alpha2.LabelComponent + "=" + v1alpha2.ComponentScheduler})
	if err != nil {
		return nil, err
	}
	byService := map[string]*pickerCounts{}
	var order []string
	for _, p := range pods.Items {
		port := metricsPort(&p)
		if port == 0 || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		name := p.Namespace + "/" + p.Labels[v1alpha2.LabelName]
		pc := byService[name]
		if pc == nil {
			pc = &pickerCounts{service: name, counts: Counts{ServedIn: map[string]float64{}}}
			byService[name] = pc
			order = append(order, name)
		}
		b, err := podMetrics(ctx, cs, &p, port)
		var c Counts
		if err == nil {
			c, err = PickerCounts(b)
		}
		if err != nil {
			pc.err = fmt.Errorf("metrics of pod %s/%s: %w", p.Namespace, p.Name, err)
			continue
		}
		pc.counts.Entered += c.Entered
		for k, v := range c.ServedIn {
			pc.counts.ServedIn[k] += v
		}
	}
	out := make([]pickerCounts, 0, len(order))
	for _, n := range order {
		out = append(out, *byService[n])
	}
	return out, nil
}

// metricsPort is the picker container's port named "metrics", 0 when none.
func metricsPort(p *corev1.Pod) int32 {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == metricsPortName {
				return port.ContainerPort
			}
		}
	}
	return 0
}

// podMetrics reads a pod's /metrics through the pod proxy, or directly
// when the pod's address is a loopback address (see scrapePickers).
func podMetrics(ctx context.Context, cs kubernetes.Interface, p *corev1.Pod, port int32) ([]byte, error) {
	if ip, err := netip.ParseAddr(p.Status.PodIP); err == nil && ip.IsLoopback() {
		return httpget.Body(ctx, "http://"+net.JoinHostPort(ip.String(), strconv.Itoa(int(port)))+"/metrics", 16<<20)
	}
	return cs.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, strconv.Itoa(int(port)), "metrics", nil).DoRaw(ctx)
}

// elsewhere is "cluster share (count)" for every other cluster that served
// requests entering here.
func elsewhere(c Counts) string {
	var names []string
	for n, v := range c.ServedIn {
		if n != "" && v > 0 {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "-"
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %s (%.0f)", n, share(c.ServedIn[n], c.Entered), c.ServedIn[n])
	}
	return strings.Join(parts, ", ")
}

func share(n, total float64) string {
	if total <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*n/total)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

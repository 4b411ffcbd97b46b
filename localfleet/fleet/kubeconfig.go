package fleet

import (
	"os"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Kubeconfig is one kubeconfig for the whole fleet: a context per cluster
// named after it ("hub", then each spoke), each with the cluster's admin
// credentials; the current context is the hub's.
func (f *Fleet) Kubeconfig() clientcmdapi.Config {
	kc := clientcmdapi.NewConfig()
	for _, c := range append([]*Cluster{f.Hub}, f.Spokes...) {
		cfg, name := c.Admin(), c.Name()
		kc.Clusters[name] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
		kc.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
		kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	}
	kc.CurrentContext = f.Hub.Name()
	return *kc
}

// WriteKubeconfig writes Kubeconfig to path, readable by the user only; it
// appears whole or not at all.
func (f *Fleet) WriteKubeconfig(path string) error {
	b, err := clientcmd.Write(f.Kubeconfig())
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// kube-apiserver, run in this process from the published k8s.io/kubernetes module: the same
// options, completion, validation and server chain (aggregator → kube APIs → apiextensions) as
// the kube-apiserver binary, configured by the binary's own flags. It serves TLS on 127.0.0.1
// only, authenticates one static bearer token (group system:masters), authorizes with RBAC and
// stores in the embedded etcd.
package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/rest"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// apiServerArgs are the kube-apiserver flags of one run.
func apiServerArgs(etcdURL string, port int, p *pki) []string {
	return []string{
		"--etcd-servers=" + etcdURL,
		"--storage-backend=etcd3",
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--tls-cert-file=" + p.servingCert,
		"--tls-private-key-file=" + p.servingKey,
		"--client-ca-file=" + p.caCertFile,
		"--token-auth-file=" + p.tokenAuthFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saPublicKey,
		"--service-account-signing-key-file=" + p.saSigningKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		// The "kubernetes" Service's endpoints would name a loopback address, which the
		// Endpoints validation rejects; nothing here routes to it.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
}

// apiServer holds the parsed options of the API server until it runs.
type apiServer struct {
	opts *apiserveroptions.ServerRunOptions
}

// newAPIServer registers the API server's flags and parses args into its options.
func newAPIServer(args []string) (*apiServer, error) {
	opts := apiserveroptions.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range opts.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}
	return &apiServer{opts: opts}, nil
}

// run completes and validates the options, then serves until ctx is done.
func (a *apiServer) run(ctx context.Context) error {
	// The API server's loopback clients should not log warnings the server issued itself.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	completed, err := a.opts.Complete(ctx)
	if err != nil {
		return fmt.Errorf("completing kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return fmt.Errorf("validating kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}
	if err := apiserverapp.Run(ctx, completed); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	return nil
}

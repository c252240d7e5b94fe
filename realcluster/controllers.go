// The controllers of kube-controller-manager whose behaviour clients observe through the API
// and which a bare API server lacks: the garbage collector (background, foreground and orphan
// deletion through ownerReferences), the namespace controller (deleting a namespace's contents,
// then the namespace) and the ServiceAccount controllers (each namespace's "default"
// ServiceAccount and its token). They run from kube-controller-manager's own code and options,
// restricted with its --controllers flag, without leader election and without a serving port.
package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	"k8s.io/kubernetes/cmd/kube-controller-manager/names"
)

// enabledControllers is the --controllers list of kube-controller-manager.
var enabledControllers = []string{
	names.GarbageCollectorController,
	names.NamespaceController,
	names.ServiceAccountController,
	names.ServiceAccountTokenController,
}

// controllerManager holds the parsed options of the controllers until they run.
type controllerManager struct {
	opts *kcmoptions.KubeControllerManagerOptions
}

// newControllerManager registers kube-controller-manager's flags and parses its arguments.
func newControllerManager(kubeconfig string, p *pki) (*controllerManager, error) {
	opts, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager options: %w", err)
	}
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	named := opts.Flags(kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases())
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + strings.Join(enabledControllers, ","),
		"--leader-elect=false",
		"--secure-port=0",
		"--service-account-private-key-file=" + p.saSigningKey,
		"--root-ca-file=" + p.caCertFile,
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-controller-manager flags: %w", err)
	}
	return &controllerManager{opts: opts}, nil
}

// run builds the controller manager's configuration and runs the controllers until ctx is done.
func (c *controllerManager) run(ctx context.Context) error {
	cfg, err := c.opts.Config(kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases())
	if err != nil {
		return fmt.Errorf("kube-controller-manager configuration: %w", err)
	}
	if err := kcmapp.Run(ctx, cfg.Complete()); err != nil {
		return fmt.Errorf("kube-controller-manager: %w", err)
	}
	return nil
}

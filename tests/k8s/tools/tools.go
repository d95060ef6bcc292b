//go:build tools

// Package tools pins the Kubernetes binaries the operator's integration tests run (a real
// kube-apiserver, kube-controller-manager and kubectl), built from the Go module proxy by
// install.sh. k8s.io/kubernetes is not meant to be a dependency: its go.mod requires its staging
// modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and replaces them with directories of its
// own repository, which a dependant cannot see. go.mod here replaces each with its published
// v0.X.Y, the release that matches v1.X.Y.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)

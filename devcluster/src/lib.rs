//! An in-memory, kubectl-compatible Kubernetes API server for development and tests.

"""The Kubernetes operator: AgentRunPool -> worker Deployment, Service, PDB.

`runlease operator` runs it (kopf underneath). Handlers are thin: they read
the resource, call the pure builders in build.py, apply the manifests through
k8s.py, and write status.
"""

"""What the tests and the bench share to drive the local control plane and the operator, as kopf.testing is for
kopf: hack/cluster.sh and its clusters, the operator's /metrics, stopping a subprocess. Neither pytest nor the bench
is imported here, so both can use it; each turns its errors into its own kind of failure."""

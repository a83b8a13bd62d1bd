"""Every price: collectives, kernels, FLOPs and memory, one home each."""

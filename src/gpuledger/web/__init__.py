"""HTTP: the node controller's endpoints and metrics."""

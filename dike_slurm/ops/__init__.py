"""Running the engine as a service: the loop, metrics, alerting, deployment files."""

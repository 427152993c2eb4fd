"""pod.delete, pod.kill and deployment.scale: faults through the Kubernetes API."""

"""What the scheduler reports on itself: Prometheus metrics and each request's spans."""

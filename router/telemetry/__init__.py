"""What the router reports: latency metrics and a GenAI span per request."""

"""The router's links to its scheduler replicas: a stream to each, the pool over them, their messages."""

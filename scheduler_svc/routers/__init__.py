"""The scheduler's side of its routers' streams: sessions, outboxes and their scheduler.proto messages."""

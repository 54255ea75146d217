"""Real servers for the remote tests (SeaweedFS S3, a ranged HTTP server, a fault proxy): see the plugin."""

pytest_plugins = ["tokenloom.formats.remote.pytest_plugin"]

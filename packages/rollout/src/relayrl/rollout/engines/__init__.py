"""Inference engines: the built-in torch engine, and the HTTP client of an engine server."""

# Shared fixtures (an S3 server on loopback, plugin-manager isolation) from relayrl-core's testing module.
from relayrl.core.testing.fixtures import isolated_plugins, s3_server, s3_url  # noqa: F401

# Shared fixtures (an S3 server on loopback) from relayrl-core's testing module.
from relayrl.core.testing.fixtures import s3_server, s3_url  # noqa: F401

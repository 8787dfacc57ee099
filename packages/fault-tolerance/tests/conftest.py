from relayrl.core.testing.fixtures import isolated_plugins, s3_server, s3_url  # noqa: F401

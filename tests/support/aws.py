"""AWS for tests: fake credentials and a loopback endpoint (moto), never a real account."""

from __future__ import annotations

import os


def aws_test_env(endpoint: str) -> dict[str, str]:
    """Fake credentials and a loopback endpoint; never the instance metadata service."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }

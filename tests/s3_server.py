"""A real S3-compatible server for the tests: moto's, on a free local port, and a pyarrow client of it
(the ``endpoint`` fixture in conftest.py starts one per test module)."""
import socket

import pyarrow.fs as pafs

KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server():
    """moto's S3-compatible server on a free local port (moto[server] is in the test extra: a
    missing or broken server fails these tests rather than skipping them)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    return server, f"http://127.0.0.1:{server._port}"


def s3_client(url: str) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(endpoint_override=url, access_key="testing", secret_key="testing", region="us-east-1",
                             allow_bucket_creation=True, allow_bucket_deletion=True)

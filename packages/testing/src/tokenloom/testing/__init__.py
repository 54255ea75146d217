"""Real local servers for tests and demos of data in object storage; never a dependency of a shipped package.

    from tokenloom.testing import SeaweedS3

    server = SeaweedS3(tmp_path)         # SeaweedFS `weed mini` on 127.0.0.1, its own ports
    server.upload_tree(local_dir, "ds")  # then open_dataset(f"s3://{server.bucket}/ds", remote=...)

``servers``: SeaweedFS (S3), fake-gcs-server (GCS), Azurite (Azure), a ranged HTTP server and a fault-injecting
proxy. ``pytest_plugin`` (registered by the entry point ``pytest11`` when this distribution is installed): the
fixtures ``seaweed``, ``fault_proxy``, ``range_server``, ``fake_gcs`` and ``azurite``.
"""

from __future__ import annotations

from tokenloom.testing.servers import *  # noqa: F403  # pyright: ignore[reportWildcardImportFromLibrary] - the API is servers.__all__
from tokenloom.testing.servers import __all__ as __all__

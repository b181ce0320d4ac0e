"""The agent's data plane (docs/storage.md): a workload's inputs fetched into a per-host cache before its command
starts, its checkpoint restored, uploaded on a period and at every stop, its outputs uploaded at its end. The renter's
bytes go between this host and the renter's object store only, never through a relay or the Master.

| module | job |
|---|---|
| ``objects.py`` | the S3-compatible store (boto3 in threads): list, fetch, put, with multipart, retries, checksums, a rate |
| ``cache.py`` | the per-host input cache: by ETag, a disk budget, least recently used out, in-use entries kept |
| ``checkpoint.py`` | pure: which files changed since the last upload, the manifest that makes a checkpoint whole |
| ``plane.py`` | ``DataPlane``: prepares a container's data before its create, syncs while it runs, finishes at its delete |
"""

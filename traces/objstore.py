"""Object storage: ``s3://bucket/prefix`` URLs for the compile cache and the trace dataset.

One client for every S3 call (boto3), configured the standard AWS way: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_PROFILE`` / instance roles, ``AWS_REGION``, and ``AWS_ENDPOINT_URL``
(or ``AWS_ENDPOINT_URL_S3``) for an S3-compatible server such as SeaweedFS or MinIO. Credentials are
never printed: an error names the URL, the S3 error code and the fix, nothing else. Every call has a
connect/read timeout and bounded retries, and every read a size bound.

>>> split_url("s3://bucket/jobs/llama/")
('bucket', 'jobs/llama')
>>> is_url("s3://b/p"), is_url("/tmp/x")
(True, False)
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path

from traces.errors import TraceError

_URL = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?$")
#: Largest object read into memory (metadata, markers); bigger objects go to files.
MAX_SMALL_OBJECT = 64 << 20
TIMEOUT_S = 30


def is_url(location) -> bool:
    """Whether ``location`` names object storage (``s3://...``). Example: ``is_url("s3://b/p")``."""
    return str(location).startswith("s3://")


def split_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of an ``s3://bucket/prefix`` URL (no trailing slash); TraceError if malformed.

    >>> split_url("s3://bkt")
    ('bkt', '')
    """
    m = _URL.match(str(url))
    if m is None:
        raise TraceError(f"{url} is not an S3 URL: expected s3://BUCKET/PREFIX with a valid bucket name")
    return m.group(1), (m.group(2) or "").strip("/")


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


@functools.cache
def _session_client(endpoint: str | None, profile: str | None, region: str | None):
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(profile_name=profile) if profile else boto3.session.Session()
    config = Config(connect_timeout=TIMEOUT_S, read_timeout=TIMEOUT_S, retries={"max_attempts": 4, "mode": "standard"},
                    # a custom endpoint (SeaweedFS, MinIO on one host) has no per-bucket DNS names
                    s3={"addressing_style": "path" if endpoint else "auto"})
    return session, session.client("s3", endpoint_url=endpoint, config=config,
                                   region_name=region or session.region_name or "us-east-1")


def _client():
    return _session_client(_endpoint(), os.environ.get("AWS_PROFILE") or None,
                           os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None)


def _fail(url: str, exc: BaseException) -> TraceError:
    """One line naming the URL and the cause (never a credential)."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        why = "no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
    elif isinstance(exc, EndpointConnectionError):
        why = f"cannot reach the S3 endpoint {_endpoint() or '(AWS default)'}: check AWS_ENDPOINT_URL and the network"
    elif isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "?")
        fix = {"NoSuchBucket": "create the bucket or fix the URL",
               "AccessDenied": "check the credentials' permissions on this bucket",
               "InvalidAccessKeyId": "check AWS_ACCESS_KEY_ID / AWS_PROFILE",
               "SignatureDoesNotMatch": "check AWS_SECRET_ACCESS_KEY / AWS_PROFILE"}.get(code, "check the URL and "
                                                                                            "credentials")
        why = f"S3 error {code}: {fix}"
    else:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return TraceError(f"{url}: {why}")


class Bucket:
    """Objects under one ``s3://bucket/prefix``; keys are relative to the prefix.

    Example: ``Bucket("s3://ml/cache").put_bytes("a/b.json", b"{}", if_absent=True)``.
    """

    def __init__(self, url: str):
        self.url = str(url).rstrip("/")
        self.bucket, self.prefix = split_url(self.url)

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def url_of(self, rel: str) -> str:
        return f"s3://{self.bucket}/{self.key(rel)}"

    def _call(self, rel: str, fn, *args, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise _fail(self.url_of(rel), exc) from None

    def put_bytes(self, rel: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> bool:
        """Write one object (S3 makes each PUT atomic). With ``if_absent`` it is a conditional write
        (``If-None-Match: *``): False when the object already exists, so the first writer wins. With
        ``if_match`` (an ETag from :meth:`get_bytes`) it replaces only that version: False when it changed."""
        from botocore.exceptions import ClientError

        extra = {"IfNoneMatch": "*"} if if_absent else {"IfMatch": if_match} if if_match else {}
        try:
            _client()[1].put_object(Bucket=self.bucket, Key=self.key(rel), Body=data, **extra)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise _fail(self.url_of(rel), exc) from None
        except Exception as exc:  # noqa: BLE001 - botocore's transport errors
            raise _fail(self.url_of(rel), exc) from None
        return True

    def put_file(self, rel: str, path: Path) -> None:
        """Upload one local file in one PUT (whole or not at all; up to S3's 5 GiB per PUT). No
        transfer threads: this runs at interpreter exit too, when no new thread may start."""
        with open(path, "rb") as body:
            self._call(rel, _client()[1].put_object, Bucket=self.bucket, Key=self.key(rel), Body=body)

    def get_bytes(self, rel: str, max_bytes: int = MAX_SMALL_OBJECT) -> bytes | None:
        """The object's bytes, or None if it does not exist; TraceError if larger than ``max_bytes``."""
        return self.get_versioned(rel, max_bytes)[0]

    def get_versioned(self, rel: str, max_bytes: int = MAX_SMALL_OBJECT) -> tuple[bytes | None, str | None]:
        """``(bytes, ETag)`` of the object, ``(None, None)`` if it does not exist: the ETag names the version
        read, for a conditional replace (``put_bytes(..., if_match=etag)``)."""
        from botocore.exceptions import ClientError

        try:
            obj = _client()[1].get_object(Bucket=self.bucket, Key=self.key(rel))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None, None
            raise _fail(self.url_of(rel), exc) from None
        except Exception as exc:  # noqa: BLE001
            raise _fail(self.url_of(rel), exc) from None
        if obj["ContentLength"] > max_bytes:
            obj["Body"].close()
            raise TraceError(f"{self.url_of(rel)} is {obj['ContentLength']} bytes, more than the {max_bytes} "
                             "expected: it is not what neuron_stack wrote there")
        return obj["Body"].read(max_bytes), obj.get("ETag")

    def get_file(self, rel: str, path: Path) -> None:
        """Download one object to ``path`` (streamed, no transfer threads)."""
        obj = self._call(rel, _client()[1].get_object, Bucket=self.bucket, Key=self.key(rel))
        with open(path, "wb") as out:
            for chunk in self._call(rel, obj["Body"].iter_chunks, 1 << 20):
                out.write(chunk)

    def list(self, rel: str = "", limit: int | None = None) -> list[str]:
        """Keys (relative to the prefix) under ``rel``, sorted; at most ``limit`` of them (the first in
        S3's key order) when given."""
        start = self.key(rel) if rel else (self.prefix + "/" if self.prefix else "")
        bound = {"PaginationConfig": {"MaxItems": limit}} if limit is not None else {}
        pages = _client()[1].get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start, **bound)
        keys = self._call(rel, lambda: [o["Key"] for page in pages for o in page.get("Contents", [])])
        cut = len(self.prefix) + 1 if self.prefix else 0
        return sorted(k[cut:] for k in keys)


    def dirs(self) -> set[str]:
        """The first-level "directories" under the prefix (one delimiter listing, not every key)."""
        start = self.prefix + "/" if self.prefix else ""
        pages = _client()[1].get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start,
                                                                        Delimiter="/")
        found = self._call("", lambda: [c["Prefix"] for page in pages for c in page.get("CommonPrefixes", [])])
        return {c[len(start):].rstrip("/") for c in found}


def arrow_filesystem():
    """A ``pyarrow.fs.S3FileSystem`` with the same configuration (credentials resolved by boto3, so
    profiles and roles work too). Example: ``pyarrow.dataset.dataset("b/p/runs", filesystem=arrow_filesystem())``."""
    import pyarrow.fs as pafs

    session, client = _client()
    creds = session.get_credentials()
    frozen = creds.get_frozen_credentials() if creds is not None else None
    endpoint = _endpoint()
    options = {"region": client.meta.region_name, "connect_timeout": TIMEOUT_S, "request_timeout": TIMEOUT_S}
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        options.update(endpoint_override=host.rstrip("/"), scheme=scheme or "https", force_virtual_addressing=False)
    if frozen is not None:
        options.update(access_key=frozen.access_key, secret_key=frozen.secret_key, session_token=frozen.token)
    else:
        options["anonymous"] = True
    return pafs.S3FileSystem(**options)


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks. Example: ``sha256_file(Path("model.neff"))``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

"""One filesystem layer (pyarrow.fs, no Hadoop jars) for every location the package reads or
writes data at: a URI (``s3://``, ``gs://``, ``abfs://``, ``file://``) or a local path.
:func:`filesystem` resolves a location, :func:`atomic_output` publishes a file whole and durable
(docs/internals.md, "Durable staging"), settings are handed over explicitly, never through
``os.environ`` (docs/security.md). Nothing else in the package uses ``Path`` or ``os.replace`` on data.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..core.errors import ConfigurationError

if TYPE_CHECKING:  # imported where used: settings check locations when a DAG file is parsed
    import pyarrow.fs as pafs

_REMOTE = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs")


def scheme(location: str) -> str:
    """``"s3"``, ``"gs"``, ... or ``""`` for a local path (``file://`` included)."""
    s = urlsplit(location).scheme.lower() if "://" in location else ""
    return "" if s == "file" else s


def is_local(location: str) -> bool:
    return scheme(location) == ""


def local_path(location: str) -> str:
    """The absolute local path of a local location (``file://`` stripped)."""
    if location.startswith("file://"):
        location = urlsplit(location).path
    return os.path.abspath(location)


def join(location: str, *parts: str) -> str:
    """``location`` with path segments appended, keeping its scheme: URIs join with ``/``."""
    if is_local(location):
        return os.path.join(local_path(location), *parts)
    return posixpath.join(location.rstrip("/"), *parts)


def parent(location: str) -> str:
    return os.path.dirname(location) if is_local(location) else location.rstrip("/").rsplit("/", 1)[0]


def basename(location: str) -> str:
    return os.path.basename(location) if is_local(location) else location.rstrip("/").rsplit("/", 1)[-1]


#: ``abfss://<container>@<account>.dfs.core.windows.net/<path>``: Azure names the container in the
#: user part (3-63 lower-case letters, digits and single hyphens; never a ':' of a password)
_AZURE_CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
_AZURE_HOST = re.compile(r"[a-z0-9]{3,24}\.(?:dfs|blob)\.core\.[a-z0-9.-]+")


def _azure_container(s: str, rest: str) -> bool:
    """``rest`` (a location after ``scheme://``) is Azure's ``container@account.host/path``:
    its one '@' names the container, not credentials."""
    if s not in ("abfs", "abfss"):
        return False
    netloc, _slash, path = rest.partition("/")
    container, at, host = netloc.partition("@")
    return (
        bool(at)
        and "@" not in host
        and "@" not in path
        and bool(_AZURE_CONTAINER.fullmatch(container))
        and bool(_AZURE_HOST.fullmatch(host.lower()))
    )


def check_location(location: str, setting: str = "data location") -> str:
    """A location this package can use, or a ConfigurationError naming the setting."""
    if not isinstance(location, str) or not location.strip():
        raise ConfigurationError(
            f"{setting} must be a local path or a URI such as s3://bucket/prefix, got {location!r}"
        )
    s = scheme(location)
    if s and s not in _REMOTE:
        raise ConfigurationError(
            f"{setting} {location!r}: scheme {s!r} is not supported; use a local path, "
            f"file://, or one of {', '.join(_REMOTE)}"
        )
    if s and not urlsplit(location).netloc:
        raise ConfigurationError(
            f"{setting} {location!r} names no bucket or container; write {s}://bucket/prefix"
        )
    rest = location.split("://", 1)[1] if s else ""
    if s and "@" in rest and not _azure_container(s, rest):
        # s3://KEY:SECRET@bucket/ would be printed in lineage namespaces, task logs and on the
        # spark-submit command line; the location is not where credentials go. (A secret with a
        # '/' moves the '@' past the host part, so any '@' of a URI is refused.)
        shown = f"{s}://***@{rest.rpartition('@')[2]}"
        raise ConfigurationError(
            f"{setting} {shown!r} holds credentials in the URI: a location names only the bucket and prefix. "
            "Credentials go in an Airflow connection named by CDC_STORAGE_CONN_ID (or the source's "
            "storage_conn_id in the sources config), or in the workers' own identity (the docs' "
            "security page, 'Where credentials "
            "come from')"
        )
    return location


#: where object storage is and how to talk to it: not secret, shipped to Spark executors
PUBLIC_SETTINGS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "CDC_DELTA_S3_UNSAFE_RENAME",
)
#: who may use it: resolved where used, never shipped in a closure, never exported
SECRET_SETTINGS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
#: the environment variables object-storage access is configured by (module docstring)
STORAGE_ENV = PUBLIC_SETTINGS + SECRET_SETTINGS

_scoped: ContextVar[dict[str, str] | None] = ContextVar("cdc_storage_settings", default=None)
_process: dict[str, str] | None = None  # this process's (use_settings)
_credentials_file: str | None = None  # where this process read its credentials (use_settings)


def _clean(given: Mapping[str, str] | None) -> dict[str, str] | None:
    if given is None:
        return None
    return {k: str(v) for k, v in given.items() if k in STORAGE_ENV and v}


def settings() -> dict[str, str]:
    """The storage settings in effect here: those of the innermost :func:`scoped_settings`,
    else this process's (:func:`use_settings`), over the environment's. Credentials go as a
    group: when the settings handed over hold any, none of the environment's are mixed in
    (one source's key never pairs with another identity's token)."""
    given = _scoped.get()
    if given is None:
        given = _process
    env = {k: os.environ[k] for k in STORAGE_ENV if os.environ.get(k)}
    if given is None:
        return env
    out = {k: v for k, v in env.items() if k in PUBLIC_SETTINGS}
    if not any(k in given for k in SECRET_SETTINGS):  # none given: this host's own identity
        out.update({k: v for k, v in env.items() if k in SECRET_SETTINGS})
    out.update(given)
    return out


@contextmanager
def scoped_settings(given: Mapping[str, str] | None) -> Iterator[None]:
    """Storage settings (``STORAGE_ENV`` names) for the calls inside the block only, in this
    thread or task (a ContextVar: ``asyncio.to_thread`` carries it, other triggers never see it).
    None: the environment's, whatever this process was given."""
    token = _scoped.set(_clean(given) if given is not None else {})
    try:
        yield
    finally:
        _scoped.reset(token)


def use_settings(given: Mapping[str, str] | None, *, credentials_file: str | None = None) -> None:
    """Storage settings for the rest of this process (a task process, a Spark job's driver),
    or None: the environment's again. ``credentials_file`` is the file they were read from
    (:func:`read_credentials_file`): executors on this host read it too (:func:`executor_settings`)."""
    global _process, _credentials_file
    _process, _credentials_file = _clean(given), credentials_file if given is not None else None


def write_credentials_file(directory: str, given: Mapping[str, str]) -> str:
    """Settings written for a child process (a spark-submit): ``storage.json``, mode 0600, in
    ``directory`` (private to this user: ``tempfile.mkdtemp``). Its path, not its content, is
    what goes on a command line."""
    import json

    path = os.path.join(directory, "storage.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(_clean(given), f)
    return path


def read_credentials_file(path: str) -> dict[str, str]:
    import json

    with open(path) as f:
        return _clean(json.load(f)) or {}


def executor_settings() -> dict[str, str]:
    """What Spark executors get of this process's storage settings: only the public ones
    (endpoint, region, ...), and the path of the credentials file when there is one. An
    executor takes its credentials from that file when it can read it (same host), else from
    its own environment or identity (a cluster's): secrets never travel in a task closure."""
    out = {k: v for k, v in settings().items() if k in PUBLIC_SETTINGS}
    if _credentials_file and _scoped.get() is None:
        out["credentials_file"] = _credentials_file
    return out


def use_executor_settings(shipped: Mapping[str, str]) -> None:
    """On an executor: adopt :func:`executor_settings` of the driver (module docstring)."""
    given = {k: v for k, v in shipped.items() if k in PUBLIC_SETTINGS}
    path = shipped.get("credentials_file")
    if path and os.path.isfile(path):
        given.update({k: v for k, v in read_credentials_file(path).items() if k in SECRET_SETTINGS})
    use_settings(given)


def _s3_settings() -> tuple:
    s = settings()
    return (
        s.get("AWS_ENDPOINT_URL_S3") or s.get("AWS_ENDPOINT_URL") or "",
        s.get("AWS_ACCESS_KEY_ID") or "",
        s.get("AWS_SECRET_ACCESS_KEY") or "",
        s.get("AWS_SESSION_TOKEN") or "",
        s.get("AWS_REGION") or s.get("AWS_DEFAULT_REGION") or "",
    )


@lru_cache(maxsize=16)
def _s3(settings: tuple) -> pafs.FileSystem:
    import pyarrow.fs as pafs

    endpoint, key, secret, token, region = settings
    kwargs: dict = {}
    if endpoint:
        u = urlsplit(endpoint)
        kwargs.update(endpoint_override=u.netloc or u.path, scheme=u.scheme or "https")
    if key and secret:
        kwargs.update(access_key=key, secret_key=secret, session_token=token or None)
    if region:
        kwargs["region"] = region
    return pafs.S3FileSystem(**kwargs)


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path inside it)`` of a location (see the module docstring)."""
    import pyarrow.fs as pafs

    s = scheme(location)
    if not s:
        return pafs.LocalFileSystem(), local_path(location)
    if s == "s3":
        u = urlsplit(location)
        return _s3(_s3_settings()), f"{u.netloc}{u.path}".rstrip("/")
    return pafs.FileSystem.from_uri(location)


def delta_storage_options(location: str) -> dict[str, str] | None:
    """deltalake's ``storage_options`` for a location (None for local paths)."""
    if scheme(location) != "s3":
        return None
    endpoint, key, secret, token, region = _s3_settings()
    opts = {"AWS_REGION": region or "us-east-1"}
    if endpoint:
        opts["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    if key and secret:
        opts.update(AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret)
        if token:
            opts["AWS_SESSION_TOKEN"] = token
    # Delta's optimistic concurrency (and with it every writer fence, sinks/mirror_fencing.py)
    # needs a commit that fails when its version exists: S3's conditional put (If-None-Match,
    # on AWS since 2024 and on most compatible servers). A store without it can opt into
    # delta-rs's unsafe rename with CDC_DELTA_S3_UNSAFE_RENAME=true: then two writers racing
    # for one version can both "win", so run one writer per table at a time.
    if settings().get("CDC_DELTA_S3_UNSAFE_RENAME", "").strip().lower() in ("1", "true", "yes"):
        opts["AWS_S3_ALLOW_UNSAFE_RENAME"] = "true"
    else:
        opts["AWS_CONDITIONAL_PUT"] = "etag"
    return opts


# --- files -----------------------------------------------------------------------------------
def exists(location: str) -> bool:
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def is_dir(location: str) -> bool:
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        return True
    if is_local(location) or info.type == pafs.FileType.File:
        return False
    # object stores have no directories: a prefix with objects below it is one
    return bool(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))


def read_bytes(location: str) -> bytes:
    fs, path = filesystem(location)
    with fs.open_input_stream(path) as f:
        return f.read()


def read_text(location: str) -> str:
    return read_bytes(location).decode("utf-8")


def list_dir(location: str) -> list[pafs.FileInfo]:
    """The entries right below a folder (empty when it does not exist), by name."""
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(infos, key=lambda i: i.base_name)


def list_names(location: str, *, suffix: str = "", files_only: bool = True) -> list[str]:
    """Names of the entries right below a folder (hidden temporaries left out)."""
    import pyarrow.fs as pafs

    return [
        i.base_name
        for i in list_dir(location)
        if not i.base_name.startswith(".")
        and i.base_name.endswith(suffix)
        and (not files_only or i.type == pafs.FileType.File)
    ]


#: the mode of a local folder the package creates: its owner's only, so every file the package or
#: delta-rs writes inside (the mirror's and the event log's data files, which pyarrow and delta-rs
#: create with the umask's mode) is as private as a staged file (LOCAL_FILE_MODE)
LOCAL_DIR_MODE = 0o700


def makedirs(location: str) -> None:
    """Create a folder and its parents on a file system (object stores have none to create); a
    local folder created here is its owner's only (LOCAL_DIR_MODE; existing ones are left)."""
    if is_local(location):
        path = local_path(location)
        missing = []
        while path and not os.path.isdir(path):
            missing.append(path)
            parent_path = os.path.dirname(path)
            if parent_path == path:
                break
            path = parent_path
        for p in reversed(missing):
            try:
                os.mkdir(p, LOCAL_DIR_MODE)
            except FileExistsError:  # made meanwhile by another writer
                continue


def delete(location: str) -> None:
    """Remove a file (absent is fine)."""
    fs, path = filesystem(location)
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass


def delete_dir(location: str) -> None:
    fs, path = filesystem(location)
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass


def _fsync(path: str) -> None:
    """Flush a file's data, or a folder's entries, to the disk (POSIX: a folder opens read-only).
    A file system that cannot fsync a folder (EINVAL) has nothing more to flush."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


#: what a published local file may be read by: its owner only. Staged segments, chunks and
#: exports hold row values of the source (the docs' security page)
LOCAL_FILE_MODE = 0o600


@contextmanager
def atomic_output(location: str, *, replace: bool = True) -> Iterator[tuple[pafs.FileSystem, str]]:
    """Publish a file at ``location`` whole or not at all. Yields ``(filesystem, temporary
    path)`` to write to; the file appears at ``location`` only when the block ends without an
    exception (see the module docstring). A local file is its owner's alone (0600).
    ``replace`` False: an existing file at ``location`` is never replaced (a
    ConfigurationError, checked before and, locally, atomically at the publish)."""
    fs, path = filesystem(location)
    if not replace and exists(location):
        raise ConfigurationError(
            f"{location} exists already; nothing was written (give another location, or say "
            "that it may be replaced)"
        )
    head, _, name = path.rpartition("/")
    created: list[str] = []  # folders made here: each needs its parent's entry made durable
    if is_local(location):
        head, name = os.path.split(path)
        folder = head
        while folder and not os.path.isdir(folder):
            created.append(folder)
            folder = os.path.dirname(folder)
        makedirs(head)
        tmp = os.path.join(head, f".{name}.{uuid.uuid4().hex}.tmp")
    else:
        tmp = f"{head}/.{name}.{uuid.uuid4().hex}.tmp"
    try:
        yield fs, tmp
        if is_local(location):
            os.chmod(tmp, LOCAL_FILE_MODE)
            _fsync(tmp)
            if replace:
                os.replace(tmp, path)
            else:
                try:
                    os.link(tmp, path)  # fails when the file appeared meanwhile: never replaced
                except FileExistsError:
                    raise ConfigurationError(
                        f"{location} appeared while it was written; it was not replaced"
                    ) from None
                os.unlink(tmp)
            # the rename lives in the folder's entries: without this a power loss may undo
            # it after the caller went on (e.g. confirmed the slot past the published segment)
            for folder in [head, *(os.path.dirname(f) for f in created)]:
                _fsync(folder or ".")
        else:
            if not replace and exists(location):
                raise ConfigurationError(f"{location} appeared while it was written; it was not replaced")
            fs.copy_file(tmp, path)  # the server creates the object complete
            fs.delete_file(tmp)
    except BaseException:
        try:
            fs.delete_file(tmp)
        except Exception:  # noqa: BLE001 - the temporary may not exist; the error that matters is raised
            pass
        raise


class AlreadyExists(Exception):
    """:func:`put_if_absent` found an object at the location: another writer was first."""


def put_if_absent(location: str, data: bytes) -> None:
    """Create the object at ``location`` with ``data`` only if nothing is there, atomically
    against any other writer (:class:`AlreadyExists` otherwise): the primitive of a Delta
    commit, whose next version must be claimed by exactly one writer. Local files: a hard
    link of a complete temporary file (never replaces). S3: a conditional put (``If-None-Match:
    *``, AWS since 2024 and most compatible servers), or with ``CDC_DELTA_S3_UNSAFE_RENAME``
    a check and a put (then run one writer per table at a time, as for delta-rs). Other
    schemes: ConfigurationError, nothing written."""
    s = scheme(location)
    if not s:
        path = local_path(location)
        head, name = os.path.split(path)
        makedirs(head)
        tmp = os.path.join(head, f".{name}.{uuid.uuid4().hex}.tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, LOCAL_FILE_MODE), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise AlreadyExists(location) from None
        finally:
            os.unlink(tmp)
        _fsync(head)
        return
    if s == "s3":
        u = urlsplit(location)
        bucket, key = u.netloc, u.path.lstrip("/")
        if settings().get("CDC_DELTA_S3_UNSAFE_RENAME", "").strip().lower() in ("1", "true", "yes"):
            if exists(location):
                raise AlreadyExists(location)
            write_bytes(location, data)
            return
        from botocore.exceptions import ClientError

        try:
            _boto_s3(_s3_settings()).put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                raise AlreadyExists(location) from None
            raise
        return
    raise ConfigurationError(
        f"{location}: the mirror's commits need a put-if-absent on the store, which this package "
        "implements for local folders and S3 only; put CDC_DATA_DIR on one of those"
    )


@lru_cache(maxsize=16)
def _boto_s3(settings: tuple):
    import boto3

    endpoint, key, secret, token, region = settings
    kwargs: dict = {"region_name": region or "us-east-1"}
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    if key and secret:
        kwargs.update(aws_access_key_id=key, aws_secret_access_key=secret, aws_session_token=token or None)
    return boto3.session.Session().client("s3", **kwargs)


def write_bytes(location: str, data: bytes) -> None:
    """One whole file (see :func:`atomic_output`)."""
    with atomic_output(location) as (fs, tmp), fs.open_output_stream(tmp) as f:
        f.write(data)


def write_text(location: str, text: str) -> None:
    write_bytes(location, text.encode("utf-8"))

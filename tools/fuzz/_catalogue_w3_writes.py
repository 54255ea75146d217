"""Catalogue rows for issue #23 item 8: writing datasets to object storage (no network: 127.0.0.1 only)."""

from __future__ import annotations

from pathlib import Path

from _catalogue_base import Outcome, Run, _cli, case, copy

_SECRET = "catalogue-writes-secret-never-printed"


def _says(*words: str, cwd: Path | None = None):
    def check(outcome: Outcome) -> str | None:
        for name in ("s3:", "https:", "gs:", "az:"):
            if cwd is not None and (cwd / name).exists():
                return f"a local directory {cwd / name} was written for a URL"
        text = f"{outcome.stdout}{outcome.stderr}{outcome.exception or ''}"
        if _SECRET in text:
            return "the secret appears in the output"
        missing = [word for word in words if word not in text]
        return f"the error does not say {missing}" if missing else None

    return check


def _inputs(tmp: Path) -> Path:
    inputs = tmp / "in"
    inputs.mkdir()
    (inputs / "a.jsonl").write_text('{"text": "one two"}\n', encoding="utf-8")
    return inputs


def _tokenize_to(tmp: Path, output: str, *extra: str) -> Run:
    argv = ["tokenize", "--input-dir", str(_inputs(tmp)), "--output-dir", output, "--num-workers", "0"]
    command = _cli(*argv, "--no-progress", *extra)
    return Run(process=["sh", "-c", f'cd "{tmp}" && exec "$@"', "sh", *command], check=None)


@case("tokenize: --output-dir https://host/tok (read-only scheme)", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    run = _tokenize_to(tmp, "https://host/tok")
    run.check = _says("read-only", cwd=tmp)
    return run


@case("tokenize: --output-dir s3://bucket (a bucket root)", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    run = _tokenize_to(tmp, "s3://bucket")
    run.check = _says("bucket root", cwd=tmp)
    return run


@case("tokenize: --output-dir s3://bucket/tok --format megatron", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    run = _tokenize_to(tmp, "s3://bucket/tok", "--format", "megatron")
    run.check = _says("not supported yet", cwd=tmp)
    return run


@case("tokenize: --output-dir s3://bucket/tok --executor ray", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    run = _tokenize_to(tmp, "s3://bucket/tok", "--executor", "ray")
    run.check = _says("not supported yet", cwd=tmp)
    return run


@case("tokenize: --output-dir s3://bucket/tok --num-nodes 2 --overwrite", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    run = _tokenize_to(tmp, "s3://bucket/tok", "--num-nodes", "2", "--node-rank", "0", "--overwrite")
    run.check = _says("--overwrite", "Delete the output prefix", cwd=tmp)
    return run


@case("tokenize: --input-dir https://host/raw (not listable)", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    command = _cli("tokenize", "--input-dir", "https://host/raw", "--output-dir", "out", "--no-progress")
    return Run(
        process=["sh", "-c", f'cd "{tmp}" && exec "$@"', "sh", *command], check=_says("cannot be listed", cwd=tmp)
    )


@case("convert: an https:// target (read-only scheme)", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    src = copy("native", tmp)
    command = _cli("convert", str(src), "https://host/out", "--to", "native", "--no-progress")
    return Run(
        process=["sh", "-c", f'cd "{tmp}" && exec "$@"', "sh", *command],
        sources=[src],
        check=_says("read-only", cwd=tmp),
    )


@case("convert: an s3:// target inside the s3:// source", "bad input", "error", "ConfigError")
def _(tmp: Path) -> Run:
    from tokenloom.formats import convert_dataset

    return Run(
        call=lambda: convert_dataset("s3://bucket/ds", "s3://bucket/ds/copy", to="native", target_plan_cache_dir=tmp),
        check=_says("overlaps the source"),
    )


@case("remote put: every attempt answered 503 (SlowDown)", "fault", "error", "StorageError")
def _(tmp: Path) -> Run:
    from tokenloom.formats.io import parse_url
    from tokenloom.formats.remote.client import RetryPolicy, StoreConfig
    from tokenloom.formats.remote.helper import put_file
    from tokenloom.testing.servers import FaultProxy

    proxy = FaultProxy("http://127.0.0.1:9")  # nothing behind it: every PUT is answered 503 by the proxy
    proxy.fault_methods = {"PUT"}
    proxy.faults = ["503"] * 10
    options = {"endpoint": proxy.url, "access_key_id": "k", "secret_access_key": _SECRET, "region": "us-east-1"}
    options["client_options"] = {"allow_http": True}  # type: ignore[assignment]
    config = StoreConfig(parse_url("s3://bucket/ds"), options, RetryPolicy(max_retries=2, backoff=0.01))
    shard = tmp / "shard_00000.bin"
    shard.write_bytes(b"\x01\x00" * 100)
    return Run(
        call=lambda: put_file(config, shard, "shard_00000.bin", "0" * 32),
        check=_says("s3://bucket/ds/shard_00000.bin", "failed 3 times while uploading"),
        cleanup=proxy.close,
    )

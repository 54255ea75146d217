"""--layout tree and --val-fraction from a bucket into a bucket, on node processes, against a real S3 server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from tokenize_helpers import write_texts

from tokenloom.formats import ConfigError, DataError, RemoteOptions, ResumeMismatchError, open_dataset
from tokenloom.tokenize import Layout, TokenizeConfig, tokenize

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses SIGKILL and process groups")

OPTIONS: dict[str, Any] = {"shard_size_tokens": 3000, "seq_len": 64, "overlap_size": 8, "unit_bytes": 6000}
#: the datasets of the trees below: val/<bucket> carved from train/<bucket> by --val-fraction, or given
DATASETS = ("train/code", "train/web", "val/code", "val/web")


def _env(seaweed: Any, cache: Path) -> dict[str, str]:
    """The S3 server's endpoint and keys in the environment, as on a cluster; a cache of the node's own."""
    return {
        **os.environ,
        **seaweed.env,
        "AWS_ENDPOINT_URL": seaweed.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "TOKENLOOM_CACHE_DIR": str(cache),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def _upload(seaweed: Any, local: Path, name: str) -> str:
    key = f"{name}-{uuid.uuid4().hex[:8]}"
    for path in sorted(local.rglob("*")):
        if path.is_file():
            seaweed.put(f"{key}/{path.relative_to(local).as_posix()}", path.read_bytes())
    return f"s3://{seaweed.bucket}/{key}"


def _command(input_dir: object, output_dir: object, tokenizer: Path, *extra: str) -> list[str]:
    options = [f"--{k.replace('_', '-')}={v}" for k, v in OPTIONS.items()]
    return [
        sys.executable, "-m", "tokenloom.formats", "tokenize", f"--input-dir={input_dir}", f"--output-dir={output_dir}",
        f"--tokenizer={tokenizer}", "--layout=tree", "--num-workers=0", "--no-progress", *options, *extra,
    ]  # fmt: skip


def _manifest(data: bytes) -> dict[str, Any]:
    """A manifest without what legitimately differs between a bucket run and a local one.

    The inputs are identified by ETag (from a bucket) or size + mtime (a local directory), the engine's
    record says how it was chosen, and the manifest's checksum covers those; everything else is equal.
    """
    record = orjson.loads(data)
    tokenize_record = record["metadata"]["tokenize"]
    tokenize_record.pop("engine")
    inputs = tokenize_record.pop("inputs")
    tokenize_record["input_names"] = [(i["path"], i["size"]) for i in inputs]
    record.pop("checksum", None)
    return record


def _assert_same_as_local(objects: dict[str, bytes], local: Path) -> None:
    """Every dataset file at the URL is the local run's bytes (manifests modulo :func:`_manifest`)."""
    expected = {
        p.relative_to(local).as_posix(): p.read_bytes()
        for p in sorted(local.rglob("*"))
        if p.is_file() and (p.suffix in (".bin", ".idx") or p.name == "manifest.json")
    }
    found = {name: data for name, data in objects.items() if name.endswith((".bin", ".idx", "manifest.json"))}
    assert sorted(found) == sorted(expected)
    assert {name.rsplit("/", 1)[0] for name in expected if name.endswith("manifest.json")} == set(DATASETS)
    for name, data in expected.items():
        if name.endswith("manifest.json"):
            assert _manifest(found[name]) == _manifest(data), name
        else:
            assert found[name] == data, name
    # the run files: each dataset's plan and one done marker per unit, as on local disk
    run_files = {p.relative_to(local).as_posix() for p in local.rglob(".tokenloom-*") if "lock" not in p.name}
    assert {name for name in objects if "/.tokenloom-" in name} == run_files


def _local_reference(raw: Path, out: Path, tokenizer: Path, **extra: Any) -> Path:
    values = {**OPTIONS, "layout": Layout.TREE, **extra}
    tokenize(TokenizeConfig(input_dir=raw, output_dir=out, tokenizer=str(tokenizer), num_workers=0, **values))  # type: ignore[arg-type]
    return out


def test_tree_with_val_fraction_from_a_bucket_into_a_bucket_on_three_nodes_is_the_local_run(
    seaweed, raw, tmp_path, tiny_tokenizer
) -> None:
    source = _upload(seaweed, raw, "raw")
    target = f"s3://{seaweed.bucket}/tokens-{uuid.uuid4().hex[:8]}"
    local = _local_reference(raw, tmp_path / "local", tiny_tokenizer, val_fraction=0.2, seed=3)
    carve = ("--val-fraction=0.2", "--seed=3", "--num-nodes=3")
    nodes = [
        subprocess.Popen(
            _command(source, target, tiny_tokenizer, *carve, f"--node-rank={rank}"),
            env=_env(seaweed, tmp_path / f"cache-{rank}"),  # separate machines: nothing shared but the bucket
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for rank in range(3)
    ]
    for node in nodes:
        _, err = node.communicate(timeout=300)
        assert node.returncode == 0, err.decode()[-3000:]
    objects = seaweed.objects(target)
    if not any(name.endswith("manifest.json") for name in objects):  # every node finished before the others
        done = subprocess.run(
            _command(source, target, tiny_tokenizer, *carve, "--finalize"),
            env=_env(seaweed, tmp_path / "cache-f"), capture_output=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        objects = seaweed.objects(target)
    _assert_same_as_local(objects, local)
    for dataset in DATASETS:
        options: dict[str, Any] = {
            "remote": RemoteOptions.from_keywords(
                block_cache_dir=tmp_path / "read", storage_options=seaweed.storage_options()
            )
        }
        remote = open_dataset(f"{target}/{dataset}", **options)
        assert remote.num_tokens == open_dataset(local / dataset).num_tokens > 0
    again = subprocess.run(
        _command(source, target, tiny_tokenizer, *carve, "--node-rank=1"),
        env=_env(seaweed, tmp_path / "cache-new-machine"), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert again.returncode == 0 and "already complete" in again.stdout, again.stderr[-3000:]


def test_a_tree_with_its_own_val_split_from_a_bucket_into_a_bucket_in_one_process(
    seaweed, raw, tmp_path, tiny_tokenizer, make_texts, monkeypatch
) -> None:
    write_texts(raw / "val" / "web" / "given.jsonl", make_texts(60, seed=30))
    write_texts(raw / "val" / "code" / "given.jsonl", make_texts(40, seed=31))
    source = _upload(seaweed, raw, "raw")
    target = f"s3://{seaweed.bucket}/tokens-{uuid.uuid4().hex[:8]}"
    local = _local_reference(raw, tmp_path / "local", tiny_tokenizer)
    for name, value in _env(seaweed, tmp_path / "cache").items():
        monkeypatch.setenv(name, value)
    config = TokenizeConfig(input_dir=source, output_dir=target, tokenizer=str(tiny_tokenizer), num_workers=1,  # type: ignore[arg-type]
                            layout=Layout.TREE, **OPTIONS)  # fmt: skip
    summary = tokenize(config)
    assert summary.datasets == list(DATASETS)
    assert summary.tokens == sum(open_dataset(local / d).num_tokens for d in DATASETS)
    _assert_same_as_local(seaweed.objects(target), local)
    assert not list((tmp_path / "cache" / "uploads").rglob("*.bin"))  # the staging copy is gone
    assert tokenize(config).already_complete
    # the same tree from the bucket onto local disk: the same datasets
    from_bucket = tmp_path / "from-bucket"
    tokenize(TokenizeConfig(input_dir=source, output_dir=from_bucket, tokenizer=str(tiny_tokenizer), num_workers=0,  # type: ignore[arg-type]
                            layout=Layout.TREE, **OPTIONS))  # fmt: skip
    for dataset in DATASETS:
        for shard in (local / dataset).glob("unit_*"):
            assert (from_bucket / dataset / shard.name).read_bytes() == shard.read_bytes()


def test_val_fraction_on_a_flat_prefix_writes_train_and_val_at_the_url(
    seaweed, tmp_path, tiny_tokenizer, make_texts, monkeypatch
) -> None:
    flat = tmp_path / "flat"
    write_texts(flat / "a.jsonl", make_texts(400, seed=1))
    source = _upload(seaweed, flat, "flat")
    target = f"s3://{seaweed.bucket}/tokens-{uuid.uuid4().hex[:8]}"
    for name, value in _env(seaweed, tmp_path / "cache").items():
        monkeypatch.setenv(name, value)
    values = {**OPTIONS, "val_fraction": 0.1}
    local = tmp_path / "local"
    tokenize(TokenizeConfig(input_dir=flat, output_dir=local, tokenizer=str(tiny_tokenizer), num_workers=0, **values))  # type: ignore[arg-type]
    from tokenloom.formats.remote import helper

    commits: list[str] = []  # every done marker created at the URL, in order
    puts: list[str] = []  # every object put at the URL (done markers too), in order
    put_once, put_file = helper.put_once, helper.put_file

    def name_of(config: Any, name: str) -> str:
        return f"{str(config.url).removeprefix(target + '/')}/{name}"

    def recorded_once(config: Any, path: Any, name: str, checksum: str) -> bool:
        if name.endswith(".done"):
            commits.append(name_of(config, name))
            puts.append(name_of(config, name))
        return put_once(config, path, name, checksum)

    def recorded_put(config: Any, path: Any, name: str, checksum: str, *args: Any) -> str:
        puts.append(name_of(config, name))
        return put_file(config, path, name, checksum, *args)

    monkeypatch.setattr(helper, "put_once", recorded_once)
    monkeypatch.setattr(helper, "put_file", recorded_put)
    summary = tokenize(TokenizeConfig(input_dir=source, output_dir=target, tokenizer=str(tiny_tokenizer),  # type: ignore[arg-type]
                                      num_workers=0, **values))  # fmt: skip
    assert summary.datasets == ["train", "val"]
    units = sorted(name.rsplit("/", 1)[1] for name in commits if name.startswith("train/"))
    assert len(units) > 1  # --unit-bytes cut the file: several units, each committed val first
    assert commits == [f"{split}/{unit}" for unit in units for split in ("val", "train")]
    for split in ("train", "val"):  # each manifest after every shard and done marker of its dataset
        mine = [name for name in puts if name.startswith(f"{split}/")]
        assert mine[-1] == f"{split}/manifest.json" and mine.count(f"{split}/manifest.json") == 1
        assert sum(name.endswith(".bin") for name in mine) == len(list((local / split).glob("*.bin")))
    objects = seaweed.objects(target)
    for split in ("train", "val"):
        for shard in (local / split).glob("unit_*"):
            assert objects[f"{split}/{shard.name}"] == shard.read_bytes()
        assert _manifest(objects[f"{split}/manifest.json"]) == _manifest((local / split / "manifest.json").read_bytes())


def _run_killed(command: list[str], env: dict[str, str], ready: Callable[[], bool], timeout: float = 120) -> None:
    """Start ``command`` in its own process group and SIGKILL the group once ``ready()`` holds."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            if proc.poll() is not None:
                pytest.fail(f"the node ended before it could be killed: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the node never reached the kill point"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the node and its object-store helper
        proc.wait(timeout=30)


def test_a_node_killed_mid_tree_is_rerun_and_the_output_is_the_local_run(
    seaweed, fault_proxy, raw, tmp_path, tiny_tokenizer
):
    """Node 0 is killed after 3 committed units, while the upload of its val/code unit 4 is held at the proxy.

    The hold bounds how far node 0 gets: before it, the kill could land after node 0 had committed all its
    val/code units (the poll read every object, a second or more under load), node 1 then wrote that
    dataset's manifest, and the check that node 1 writes none failed (2 runs in 7 on a loaded machine)."""
    source = _upload(seaweed, raw, "raw")
    target = f"s3://{seaweed.bucket}/tokens-{uuid.uuid4().hex[:8]}"
    local = _local_reference(raw, tmp_path / "local", tiny_tokenizer, val_fraction=0.2)
    carve = ("--val-fraction=0.2", "--num-nodes=2")
    released = threading.Event()
    fault_proxy.hold[f"{target.removeprefix('s3:/')}/val/code/.tokenloom-unit-000004.done"] = released

    def committed() -> int:
        with fault_proxy.lock:
            return sum(1 for path in fault_proxy.uploads if path.endswith(".done"))

    env0 = {**_env(seaweed, tmp_path / "cache-0"), "AWS_ENDPOINT_URL": fault_proxy.url}
    try:
        _run_killed(_command(source, target, tiny_tokenizer, *carve, "--node-rank=0"), env0, lambda: committed() >= 3)
    finally:
        released.set()  # the held upload is dropped: its client is dead
    fault_proxy.wait_idle()
    killed_at = committed()
    assert 3 <= killed_at <= 4  # val 0, train 0, val 2 (train 2): the held val 4 never lands
    assert not any(name.endswith("manifest.json") for name in seaweed.objects(target))
    # the carved val marker goes up before its train marker: no train unit in the bucket lacks its val part
    objects = seaweed.objects(target)
    assert "val/code/.tokenloom-unit-000004.done" not in objects
    for name in objects:
        if name.startswith("train/") and name.endswith(".done"):
            assert "val/" + name.removeprefix("train/") in objects, name
    node1 = subprocess.run(_command(source, target, tiny_tokenizer, *carve, "--node-rank=1"),
                           env=_env(seaweed, tmp_path / "cache-1"), capture_output=True, text=True, timeout=300,
                           check=False)  # fmt: skip
    assert node1.returncode == 0, node1.stderr[-3000:]
    assert "units" in node1.stdout and not any(n.endswith("manifest.json") for n in seaweed.objects(target))
    rerun = subprocess.run(_command(source, target, tiny_tokenizer, *carve, "--node-rank=0"),
                           env=env0, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    _assert_same_as_local(seaweed.objects(target), local)


def test_bad_input_and_settings_are_the_local_named_errors_and_nothing_is_written(
    seaweed, raw, tmp_path, tiny_tokenizer, make_texts, monkeypatch
) -> None:
    for name, value in _env(seaweed, tmp_path / "cache").items():
        monkeypatch.setenv(name, value)
    target = f"s3://{seaweed.bucket}/tokens-{uuid.uuid4().hex[:8]}"

    def config(source: str, **extra: Any) -> TokenizeConfig:
        values = {**OPTIONS, "layout": Layout.TREE, "num_workers": 0, **extra}
        return TokenizeConfig(input_dir=source, output_dir=target, tokenizer=str(tiny_tokenizer), **values)  # type: ignore[arg-type]

    write_texts(raw / "train" / "stray.jsonl", make_texts(5))
    stray = _upload(seaweed, raw, "stray")
    with pytest.raises(ConfigError, match=r"input train/stray\.jsonl is not inside a <split>/<bucket>/") as info:
        tokenize(config(stray))
    assert info.value.path == f"{stray}/train/stray.jsonl"
    (raw / "train" / "stray.jsonl").unlink()
    write_texts(raw / "val" / "web" / "v.jsonl", make_texts(5))
    with_val = _upload(seaweed, raw, "with-val")
    with pytest.raises(ConfigError, match="already has a val split") as info:
        tokenize(config(with_val, val_fraction=0.1))
    assert info.value.path == f"{with_val}/val"
    assert seaweed.objects(target) == {}
    tokenize(config(with_val, num_nodes=2))  # node 0 of a run
    with pytest.raises(ResumeMismatchError, match="max_length"):  # node 1 with other settings
        tokenize(config(with_val, num_nodes=2, node_rank=1, seq_len=32))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"layout": "tree", "executor": "ray"}, "--layout tree and --val-fraction do not run with --executor ray"),
        ({"val_fraction": 0.1, "executor": "ray"}, "--layout tree and --val-fraction do not run with --executor ray"),
        ({"layout": "tree", "overwrite": True}, "Delete the output prefix"),
        ({"val_fraction": 0.1, "overwrite": True}, "Delete the output prefix"),
    ],
)
def test_what_stays_refused_into_a_bucket(options: dict[str, Any], match: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=match):
        TokenizeConfig(input_dir=tmp_path, output_dir="s3://b/tokens", **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="executor ray"):  # from a bucket: the tasks' fetches
        TokenizeConfig(input_dir="s3://b/raw", output_dir=tmp_path, layout="tree", executor="ray")  # type: ignore[arg-type]


def test_an_input_replaced_between_nodes_is_named_at_the_url_with_what_to_do_there(
    seaweed, raw, tmp_path, tiny_tokenizer, make_texts, monkeypatch
) -> None:
    """Node 1 runs after an input object was replaced: a ResumeMismatchError naming the input and the plan's URL
    (not this node's staged copy under the cache) with a remedy that works for a bucket. Before, it named
    CACHE/uploads/.../.tokenloom-plan.json and said to pass --overwrite, which a bucket output refuses."""
    for name, value in _env(seaweed, tmp_path / "cache").items():
        monkeypatch.setenv(name, value)
    source = _upload(seaweed, raw, "raw")
    target = f"s3://{seaweed.bucket}/tokens-{uuid.uuid4().hex[:8]}"

    def config(**extra: Any) -> TokenizeConfig:
        values = {**OPTIONS, "layout": Layout.TREE, "num_workers": 0, "num_nodes": 2, "val_fraction": 0.2, **extra}
        return TokenizeConfig(input_dir=source, output_dir=target, tokenizer=str(tiny_tokenizer), **values)  # type: ignore[arg-type]

    tokenize(config())
    key = source.split(f"{seaweed.bucket}/", 1)[1]
    seaweed.put(f"{key}/train/web/part-0.jsonl", b"".join(orjson.dumps({"text": t}) + b"\n" for t in make_texts(9)))
    with pytest.raises(ResumeMismatchError, match="input part-0.jsonl changed") as info:
        tokenize(config(node_rank=1))
    assert info.value.path == f"{target}/train/web/.tokenloom-plan.json"
    assert str(tmp_path) not in str(info.value)
    assert "--overwrite" not in info.value.hint and "delete this prefix" in info.value.hint


@pytest.mark.parametrize("into", ["bucket", "local"])
def test_finalize_before_every_unit_is_done_names_the_node_that_owns_them(
    into, seaweed, tmp_path, tiny_tokenizer, make_texts, monkeypatch
) -> None:
    """Two one-unit leaves on 2 nodes: a's unit is node 0's, b's is node 1's (units are dealt across the tree).
    Node 0 alone, then --finalize: the error must send the user to --node-rank 1. Before, its hint said unit u
    belongs to --node-rank u % --num-nodes, which for b's unit 0 is node 0: the node that had already run."""
    for name, value in _env(seaweed, tmp_path / "cache").items():
        monkeypatch.setenv(name, value)
    raw = tmp_path / "small"
    write_texts(raw / "train" / "a" / "a.jsonl", make_texts(20, seed=1))
    write_texts(raw / "train" / "b" / "b.jsonl", make_texts(20, seed=2))
    source = _upload(seaweed, raw, "small") if into == "bucket" else raw
    target = f"s3://{seaweed.bucket}/tokens-{uuid.uuid4().hex[:8]}" if into == "bucket" else tmp_path / "out"

    def config(**extra: Any) -> TokenizeConfig:
        values = {**OPTIONS, "layout": Layout.TREE, "num_workers": 0, "num_nodes": 2, **extra}
        return TokenizeConfig(input_dir=source, output_dir=target, tokenizer=str(tiny_tokenizer), **values)  # type: ignore[arg-type]

    tokenize(config())  # node 0: train/a's only unit
    with pytest.raises(DataError, match=r"1 of 1 units are not committed") as info:
        tokenize(config(finalize=True))
    assert str(info.value.path).endswith("train/b")
    assert info.value.hint.startswith("Rerun --node-rank 1 of --num-nodes 2"), info.value.hint
    tokenize(config(node_rank=1))
    assert tokenize(config(finalize=True)).already_complete

"""The settings of one tokenize run, validated up front."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenloom.formats import ConfigError, writable_formats
from tokenloom.formats.io import is_remote_url, refuse_remote_output
from tokenloom.formats.native import SPEC as UNIT_SPEC
from tokenloom.tokenize._record_settings import TRAIN_TYPES, RecordOptions, check_post_training
from tokenloom.tokenize._unit_files import Nodes, OnError, UnitOptions
from tokenloom.tokenize._worker import EncodeOptions
from tokenloom.tokenize.engine import DEFAULT_VERIFY_FRACTION, Engine
from tokenloom.tokenize.windowing import Windowing, member, validate_window

__all__ = [
    "TRAIN_TYPES",
    "UNIT_FORMAT",
    "ExecutorKind",
    "OnError",
    "TokenizeConfig",
    "default_num_workers",
    "nodes_from_env",
    "supported_formats",
]

if TYPE_CHECKING:  # an object store's options: imported with the remote layer, only when a URL is given
    from tokenloom.formats.remote.options import RemoteOptions

#: The format tokenize writes unit by unit (native: its spec has ``unit_shards``); any other of
#: :func:`supported_formats` is written through a staging dataset of it that is then converted (:mod:`._staged`).
UNIT_FORMAT = UNIT_SPEC.name
#: A run cuts an uncompressed .jsonl or parquet input larger than this into several units.
DEFAULT_UNIT_BYTES = 256 << 20
#: The least value of each numeric setting (None, where allowed, passes).
_LEAST = {"min_text_length": 0, "shard_size_tokens": 1, "max_line_bytes": 1, "chunk_lines": 1, "chunk_bytes": 1}
_LEAST |= {"num_workers": 0, "eos_id": 0, "unit_bytes": 1, "num_nodes": 1}


class Layout(StrEnum):
    """How --input-dir maps to output datasets."""

    FLAT = "flat"
    """Every input file under --input-dir goes into the one dataset at --output-dir."""
    TREE = "tree"
    """``IN/<split>/<bucket>/...`` becomes the dataset ``OUT/<split>/<bucket>/`` (curriculum's layout)."""


class ExecutorKind(StrEnum):
    """Who encodes the units of a unit-planned run."""

    LOCAL = "local"
    """This process and its --num-workers pool (one of --num-nodes processes)."""
    RAY = "ray"
    """Ray tasks on an existing Ray cluster (extra ``ray``)."""


def nodes_from_env(environ: dict[str, str] | None = None) -> tuple[int, int] | None:
    """(num_nodes, node_rank) from a Slurm array (or a multi-task step), or None outside Slurm."""
    environ = dict(os.environ) if environ is None else environ
    for count, rank in (("SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_ID"), ("SLURM_NTASKS", "SLURM_PROCID")):
        if count in environ and rank in environ:
            try:
                return int(environ[count]), int(environ[rank])
            except ValueError:
                raise ConfigError(
                    f"{count}={environ[count]!r} / {rank}={environ[rank]!r} are not integers",
                    field="num_nodes",
                    hint="Pass --num-nodes N --node-rank R explicitly",
                ) from None
    return None


def supported_formats() -> tuple[str, ...]:
    """The output formats tokenize writes documents into, from the format registry (asked only when a run names a
    format other than ``UNIT_FORMAT``, or --help lists them: a plain run imports no other format folder)."""
    return tuple(writable_formats(keyed=False))


def default_num_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizeConfig:
    """Everything ``tokenloom tokenize`` takes; the CLI options map one to one."""

    input_dir: Path
    """Directory searched recursively for ``.jsonl`` and ``.jsonl.gz`` files."""
    output_dir: Path
    """Dataset directory to write (created; resumed if it holds an unfinished run of the same settings).

    An ``s3://``, ``gs://`` or ``az://`` URL (native format) is built in a local staging directory
    under ``plan_cache_dir`` and uploaded unit by unit as each commits, the manifest last (:mod:`._publish`);
    ``output_url`` then holds the URL."""
    tokenizer: str | None = None
    """Hugging Face tokenizer directory or cached name; None: the shipped stdlib BPE."""
    seq_len: int | None = None
    """Longest entry in tokens, EOD included; longer documents are windowed. None: no windowing."""
    overlap_size: int = 0
    """Tokens shared by consecutive windows of one document (<= seq_len / 2 under the tokenloom rule)."""
    windowing: Windowing = Windowing.TOKENLOOM
    """The windowing rule: tokenloom (EOD in every window, seq_len counts it; the default) or
    gpt-simple (GPT-Simple's pretokenize exactly; see :mod:`tokenloom.tokenize.windowing`)."""
    min_text_length: int = 0
    """gpt-simple only: drop (and count) documents of fewer characters, as GPT-Simple's
    ``--min_text_length`` does (its default is 200). 0 keeps every document."""
    num_workers: int = field(default_factory=default_num_workers)
    """Encoding workers: threads of this process when the fast engine encodes (up to THREAD_WORKERS_MAX of
    tokenize's executor), else processes; 0 encodes on the calling thread. The output is the same for any count."""
    format: str = UNIT_FORMAT
    """Output format: native, megatron (OUT/data.bin + .idx), flat (OUT/shard_NNNNN.npy) or packed (OUT/data.pbin)."""
    drop_overlap_prefix: bool = False
    """megatron / flat / packed only: drop the overlap-prefix lengths those formats cannot store.

    Without it, ``overlap_size > 0`` with such a format is a ConfigError (the
    repeated tokens would silently count as fresh training data)."""
    keep_staging: bool = False
    """megatron / flat / packed only: keep the native staging dataset (``OUT.native-staging``) after publishing."""
    text_field: str = "text"
    """Field holding the document text; a dotted path (``meta.body``) for nested objects."""
    shard_size_tokens: int = 100_000_000
    """A shard is closed once it holds at least this many tokens."""
    on_error: OnError = OnError.RAISE
    """What a bad record does: raise (default) or skip and count."""
    overwrite: bool = False
    """Replace a non-empty output directory written with other settings."""
    eos_id: int | None = None
    """End-of-document id when the tokenizer has no EOS token (or to override it)."""
    max_line_bytes: int = 64 << 20
    """A line longer than this is a bad record (line_too_long)."""
    hash_inputs: bool = False
    """Identify inputs by content hash (xxh3-128) instead of size + mtime (a local ``input_dir`` only: objects
    in a store are identified by their ETag)."""
    chunk_lines: int = 1024
    """Lines per unit of work (affects speed and resume granularity, never the output)."""
    chunk_bytes: int = 4 << 20
    """Bytes per unit of work, whichever limit comes first."""
    progress: bool = False
    """Show a progress bar on stderr."""
    engine: str = Engine.AUTO.value
    """Encoding engine: auto (fast if proven identical to hf on the probe set, else hf), hf or fast.

    Never changes the output bytes, so it is not part of the run key: a run stopped by an engine
    mismatch resumes with ``engine="hf"``."""
    verify_fraction: float = DEFAULT_VERIFY_FRACTION
    """fast engine: the fraction of documents (chosen by content hash) re-encoded with hf and compared."""

    num_nodes: int | None = None
    """Processes (machines) that share this run, each taking the units ``u % num_nodes == node_rank`` (a tree
    counts ``u`` across all its leaves in order).

    Every run is unit-planned: each input file (or part of a large one, ``unit_bytes``) is a unit, written as its
    own shards and committed atomically, so the output is the same bytes for any number of nodes, workers or
    interruptions. None: this process alone (node 0 of 1)."""
    node_rank: int = 0
    """This process's rank among ``num_nodes``, in [0, num_nodes)."""
    unit_bytes: int | None = DEFAULT_UNIT_BYTES
    """An uncompressed .jsonl or a parquet file larger than this is cut into several units
    (line-aligned byte ranges; runs of row groups). Compressed .gz/.zst/.json.gz and Arrow files stay whole-file
    units. None: every file is one unit. Part of the plan (and so of the output's layout into shards)."""
    executor: ExecutorKind = ExecutorKind.LOCAL
    """local: this process encodes its units; ray: the units run as Ray tasks (unit-planned)."""
    ray_address: str | None = None
    """--executor ray: the cluster's address (``HOST:PORT`` of its head); None: ``RAY_ADDRESS``."""
    finalize: bool = False
    """Only write the manifest once every unit is committed (no encoding)."""
    layout: Layout = Layout.FLAT
    """tree: ``IN/<split>/<bucket>/`` -> ``OUT/<split>/<bucket>/`` datasets in one run (unit-planned)."""
    val_fraction: float = 0.0
    """Carve this fraction of the training documents (by a seeded hash of each text) into a validation split:
    ``OUT/train`` + ``OUT/val`` (flat), or ``OUT/val/<bucket>`` beside ``OUT/train/<bucket>`` (tree)."""
    seed: int = 0
    """The seed of the --val-fraction document hash."""
    remote: RemoteOptions | None = None
    """An object-store input or output: how the store is reached (``RemoteOptions.from_keywords(storage_options=
    {"endpoint": ...})``); None: the AWS_/GOOGLE_/AZURE_ variables."""
    plan_cache_dir: Path | None = None
    """An object-store input or output: where inputs are fetched to and the output is staged before upload;
    None: ``TOKENLOOM_CACHE_DIR`` or ~/.cache/tokenloom.

    Ray tasks (--executor ray) stage in their own machine's cache (the worker's ``TOKENLOOM_CACHE_DIR``, else the
    default), never in this path of the driver's."""
    train_type: str | None = None
    """sft, dpo or grpo: each input record is a conversation, preference pair or reward group, written to a record
    store (``open_records``) with its loss masks, one unit-planned run at any node count; None: text documents."""
    chat_template: Path | None = None
    """--train-type: a Jinja chat template replacing the tokenizer's own."""
    train_roles: tuple[str, ...] = ("assistant",)
    """--train-type: the roles whose turns are trained."""
    truncate: str = "skip"
    """--train-type: a record over --seq-len is skipped (counted), or cut to keep-start / keep-end."""
    astrai_config: Path | None = None
    """--train-type sft: AstrAI's preprocessing config (pipeline.json), giving the arrays AstrAI's Pipeline writes."""
    output_url: str | None = field(default=None, init=False)
    """Set from an object-store ``output_dir``: the URL the dataset is uploaded to."""
    input_url: str | None = field(default=None, init=False)
    """Set from an object-store ``input_dir`` (s3://, gs://, az://): the prefix listed for inputs; ``input_dir``
    is then the local folder (under ``plan_cache_dir``) each input is fetched into when first read."""

    def __post_init__(self) -> None:
        if is_remote_url(self.input_dir):  # before Path() mangles s3://b into s3:/b
            self._remote_input()
        object.__setattr__(self, "input_dir", Path(self.input_dir))
        if is_remote_url(self.output_dir):  # before Path() mangles s3://b into s3:/b
            self._remote_output()
        object.__setattr__(self, "output_dir", Path(self.output_dir))
        object.__setattr__(self, "on_error", member(OnError, self.on_error, "on_error"))
        object.__setattr__(self, "windowing", member(Windowing, self.windowing, "windowing"))
        if self.train_type is not None:
            check_post_training(self)
        else:
            validate_window(self.seq_len, self.overlap_size, self.windowing)
        for name, least in _LEAST.items():
            value = getattr(self, name)
            if value is not None and value < least:
                raise ConfigError(f"{name} is {value}, expected >= {least}", field=name)
        if self.min_text_length and self.windowing is not Windowing.GPT_SIMPLE:
            raise ConfigError(
                f"min_text_length is {self.min_text_length}, but it applies only to --windowing gpt-simple "
                "(the tokenloom rule keeps every document)",
                field="min_text_length",
                hint="Drop --min-text-length, or pass --windowing gpt-simple",
            )
        if self.train_type is None and self.format != UNIT_FORMAT and self.format not in supported_formats():
            raise ConfigError(
                f"format {self.format!r} is not written by tokenize, expected one of {list(supported_formats())}",
                field="format",
            )
        if self.format == UNIT_FORMAT:
            for name in ("drop_overlap_prefix", "keep_staging"):
                if getattr(self, name):
                    raise ConfigError(
                        f"{name} applies to megatron, flat and packed output, not native",
                        field=name,
                        hint=f"Drop --{name.replace('_', '-')}, or choose another --format",
                    )
        elif self.overlap_size > 0 and not self.drop_overlap_prefix:
            raise ConfigError(
                f"overlap_size is {self.overlap_size}, but format {self.format!r} cannot store overlap prefixes, "
                "so the repeated tokens would be trained on as fresh data",
                field="overlap_size",
                hint="Use --format native, set --overlap-size 0, or pass --drop-overlap-prefix to drop them knowingly",
            )
        self._check_units()
        member(Engine, self.engine, "engine")
        if not 0.0 <= self.verify_fraction <= 1.0:
            raise ConfigError(
                f"verify_fraction is {self.verify_fraction}, expected 0 <= verify_fraction <= 1",
                field="verify_fraction",
            )
        if not self.text_field or any(not part for part in self.text_field.split(".")):
            raise ConfigError(f"text_field {self.text_field!r} is not a field name or dotted path", field="text_field")
        if self.windowing is Windowing.GPT_SIMPLE and self.text_field != "text":
            raise ConfigError(
                f"text_field is {self.text_field!r}, but GPT-Simple's pretokenize always reads the field 'text' "
                "(a record without it is skipped there), so --windowing gpt-simple would not reproduce its output",
                field="text_field",
                hint="Drop --text-field (it defaults to text), or use --windowing tokenloom",
            )

    def _remote_input(self) -> None:
        from tokenloom.formats.io.urls import parse_url
        from tokenloom.tokenize.inputs import input_staging_dir

        url = parse_url(os.fspath(self.input_dir))
        if url.scheme in ("http", "https"):
            raise ConfigError(
                f"input_dir {str(url)!r}: an http(s) server cannot be listed for input files",
                field="input_dir",
                hint="Put the inputs in s3://, gs:// or az:// (or a local directory)",
            )
        if self.hash_inputs:
            raise ConfigError(
                "--hash-inputs identifies local input files by content; an object-store input is identified by "
                "its ETag (in the plan), so the flag would be ignored",
                field="hash_inputs",
                hint="Drop --hash-inputs for an s3://, gs:// or az:// --input-dir",
            )
        object.__setattr__(self, "input_url", str(url))
        object.__setattr__(self, "input_dir", input_staging_dir(str(url), self.plan_cache_dir))

    def _remote_output(self) -> None:
        if self.format != UNIT_FORMAT and self.train_type is None:  # records: checked in _record_settings
            refuse_remote_output(self.output_dir, f"tokenize output in format {self.format}")
        many = str(self.layout) == Layout.TREE.value or self.val_fraction > 0
        ray = str(self.executor) == ExecutorKind.RAY.value
        if self.overwrite and (self.num_nodes is not None or self.finalize or many or ray):
            raise ConfigError(
                "--overwrite with --num-nodes / --executor ray / --finalize / --layout tree / --val-fraction into "
                "object storage would let one node delete what another is writing",
                field="overwrite",
                hint="Delete the output prefix once, then run every node without --overwrite",
            )
        from tokenloom.formats.remote.publish import staging_dir, writable_url

        url = writable_url(self.output_dir, "tokenize output")
        object.__setattr__(self, "output_url", str(url))
        object.__setattr__(self, "output_dir", staging_dir(url, "root", self.plan_cache_dir).parent)

    @property
    def nodes(self) -> Nodes:
        """How this process deals units: the one value the planner and the publisher read."""
        ray = self.executor is ExecutorKind.RAY
        recorded = self.num_nodes if self.finalize else None if ray else self.num_nodes or 1
        return Nodes(self.num_nodes, self.node_rank, recorded)

    @property
    def staged(self) -> bool:
        """True when the output format is written by converting a native staging dataset (megatron, flat, packed)."""
        return self.train_type is None and self.format != UNIT_FORMAT

    @property
    def many_datasets(self) -> bool:
        """True when the run writes several datasets under --output-dir (--layout tree or --val-fraction)."""
        return self.layout is Layout.TREE or self.val_fraction > 0

    def _check_units(self) -> None:
        object.__setattr__(self, "executor", member(ExecutorKind, self.executor, "executor"))
        object.__setattr__(self, "layout", member(Layout, self.layout, "layout"))
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(
                f"val_fraction is {self.val_fraction}, expected a fraction in [0, 1)", field="val_fraction"
            )
        if self.many_datasets and self.executor is ExecutorKind.RAY:
            raise ConfigError(
                "--layout tree and --val-fraction do not run with --executor ray yet",
                field="executor",
                hint="Use --executor local (with --num-nodes N on several machines), or one Ray run per dataset",
            )
        num_nodes = self.num_nodes or 1
        if not 0 <= self.node_rank < num_nodes:
            raise ConfigError(
                f"node_rank is {self.node_rank}, outside [0, {num_nodes}) for num_nodes {num_nodes}",
                field="node_rank",
                hint="Pass --node-rank R with 0 <= R < --num-nodes (a Slurm array: --array=0-(N-1))",
            )
        if self.executor is ExecutorKind.RAY and num_nodes != 1:
            raise ConfigError(
                f"num_nodes is {num_nodes} with executor ray; Ray spreads the units over its cluster itself",
                field="num_nodes",
                hint="Run one driver with --executor ray, without --num-nodes",
            )
        if self.many_datasets and self.staged:
            raise ConfigError(
                f"format {self.format!r} with --layout tree or --val-fraction: each leaf is a native dataset "
                "(curriculum and eval-broadcast read the tree as native leaves)",
                field="format",
                hint="Use --format native, then tokenloom convert a leaf",
            )
        if self.overwrite and num_nodes > 1:
            raise ConfigError(
                "overwrite with num_nodes > 1: every node would clear the output the others are writing",
                field="overwrite",
                hint="Remove the output directory once before launching the nodes, without --overwrite",
            )

    def encode_options(self) -> EncodeOptions:
        """What the executor takes of this run."""
        return EncodeOptions(**self._fields_of(EncodeOptions))

    def unit_options(self) -> UnitOptions:
        """What a unit's reader and writer take of this run."""
        return UnitOptions(**self._fields_of(UnitOptions))

    def record_options(self) -> RecordOptions:
        """--train-type: what the post-training modules take of this run."""
        return RecordOptions(**self._fields_of(RecordOptions))

    def _fields_of(self, narrow: Any) -> dict[str, Any]:
        """This run's values of the fields of ``narrow`` (a frozen options value): the same names, one source."""
        return {f.name: getattr(self, f.name) for f in fields(narrow)}

    def output_settings(self) -> dict[str, Any]:
        """The settings that change the output bytes (recorded in the manifest, compared on resume)."""
        if self.train_type is not None:
            return self.record_options().settings()
        settings: dict[str, Any] = {
            "format": self.format,
            "text_field": self.text_field,
            "max_length": self.seq_len,  # recorded key: earlier manifests resume
            "overlap_size": self.overlap_size,
            "windowing": self.windowing.value,
            "min_text_length": self.min_text_length,
            "shard_size_tokens": self.shard_size_tokens,
            "on_error": self.on_error.value,
            "eos_id": self.eos_id,
            "max_line_bytes": self.max_line_bytes,
        }
        if self.staged:  # kept out of native run keys, so earlier native outputs still resume
            settings["drop_overlap_prefix"] = self.drop_overlap_prefix
        if self.val_fraction > 0:  # likewise: only runs that carve a validation split record it
            settings["val_fraction"] = self.val_fraction
            settings["seed"] = self.seed
        return settings

"""``tokenloom stream-state``: check and show the per-rank stream states of a checkpoint."""

from __future__ import annotations

from pathlib import Path

import click
import orjson

from tokenloom.formats import DataError
from tokenloom.hf_streaming._state import load_rank_states, merge_rank_states


@click.command(
    "stream-state",
    epilog="\b\nExamples:\n  tokenloom stream-state ckpt/data\n"
    "  tokenloom stream-state ckpt/data --world-size 8 --json",
)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--world-size", type=int, default=None, help="Require the files of ranks 0..N-1 (default: all found).")
@click.option("--json", "as_json", is_flag=True, help="Print the merged state as JSON (what load_state_dict takes).")
def stream_state(directory: Path, world_size: int | None, as_json: bool) -> None:
    """Check that DIRECTORY's hf_stream_rank*.json files form one resumable save, and show each slot's position.

    The check is what a resume on any topology does first: one fingerprint, one
    mode and topology, every rank x worker slot present exactly once.
    """
    try:
        merged = merge_rank_states(load_rank_states(directory, world_size))
    except DataError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    if as_json:
        click.echo(orjson.dumps(merged, option=orjson.OPT_INDENT_2).decode())
        return
    workers = merged["num_workers"]
    click.echo(f"mode       {merged['mode']}")
    click.echo(f"topology   {merged['world_size']} ranks x {workers} workers")
    click.echo("settings   " + ", ".join(f"{k} {v}" for k, v in merged["fingerprint"].items()))
    if merged["base"] is not None:
        click.echo(f"resumed at epoch {merged['base']['start']} ({len(merged['base']['epochs'])} epoch(s) partly done)")
    click.echo("rank  worker  epoch  unit#  row  token  samples  skipped")
    for slot in merged["slots"]:
        row, token = (slot["current"][0], slot["current"][1]) if slot["current"] else ("-", "-")
        click.echo(
            f"{slot['rank']:>4}  {slot['worker']:>6}  {slot['epoch']:>5}  {slot['item']:>5}  {row!s:>3}  {token!s:>5}  "
            f"{slot['samples']:>7}  {slot['skipped']:>7}"
        )

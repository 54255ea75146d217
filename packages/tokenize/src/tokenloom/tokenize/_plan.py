"""What a run reads, resolved once before anything is written: the tokenizer, the input files, the run key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tokenloom.formats import ConfigError
from tokenloom.tokenize._config import TokenizeConfig
from tokenloom.tokenize._gpt_simple import check_gpt_simple_inputs
from tokenloom.tokenize._tokenizer import default_tokenizer_path, fingerprint
from tokenloom.tokenize._unit_files import UnitPlan
from tokenloom.tokenize.inputs import InputFile, cut_units, discover_inputs, discover_remote_inputs
from tokenloom.tokenize.windowing import Windowing

__all__ = ["RunInputs", "check_tokenizer_files"]


def _run_key(config: TokenizeConfig, tokenizer_fingerprint: str, files: list[InputFile]) -> dict[str, Any]:
    return {
        "settings": config.output_settings(),
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "inputs": [f.to_json() for f in files],
    }


@dataclass(frozen=True, slots=True)
class RunInputs:
    """What a run reads, resolved once: the tokenizer, its fingerprint and the input files."""

    tokenizer: str
    tokenizer_fingerprint: str
    files: list[InputFile]

    @classmethod
    def resolve(cls, config: TokenizeConfig) -> RunInputs:
        tokenizer = config.tokenizer or str(default_tokenizer_path())
        if config.input_url is not None:  # listed now, each object fetched when first read
            files = discover_remote_inputs(config.input_url, config.remote, config.input_dir)
        else:
            files = discover_inputs(config.input_dir, hash_contents=config.hash_inputs)
        if config.windowing is Windowing.GPT_SIMPLE:
            check_gpt_simple_inputs(files)
        return cls(tokenizer, fingerprint(tokenizer), files)

    def run_key(self, config: TokenizeConfig) -> dict[str, Any]:
        return _run_key(config, self.tokenizer_fingerprint, self.files)

    def plan(self, config: TokenizeConfig) -> UnitPlan:
        """The unit plan of these inputs: its run key, and its units (whole files, byte ranges, row-group runs)."""
        run_key = {**self.run_key(config), "layout": "units", "unit_bytes": config.unit_bytes}
        return UnitPlan(run_key, tuple(cut_units(self.files, config.unit_bytes)))


def check_tokenizer_files(directory: Path) -> None:
    """A tokenizer directory's JSON files must parse: a ConfigError naming the file, not a parser traceback."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            payload = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as exc:
            raise ConfigError(
                f"{name} is not valid JSON ({exc})",
                path=path,
                field="tokenizer",
                hint="The tokenizer files are damaged; save the tokenizer again (save_pretrained) or re-copy them",
            ) from None
        if not isinstance(payload, dict):
            raise ConfigError(f"{name} is not a JSON object", path=path, field="tokenizer")

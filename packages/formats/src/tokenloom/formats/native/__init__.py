"""The native format: GPT-Simple ``.bin`` + ``.idx`` shards with tokenloom's ``manifest.json``."""

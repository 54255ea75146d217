"""tokenloom.tokenize: raw jsonl -> token shards."""

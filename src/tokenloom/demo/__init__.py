"""tokenloom.demo: the whole flow on the built-in corpus (`tokenloom demo`)."""

"""Pure parts of the queue: run states, backoff, input bounds, redaction. No I/O."""

"""One module per op: its public signature, input validation and dispatch to a backend."""

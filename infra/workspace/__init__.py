"""The workspace: where every output lives, written atomically, keyed by what made it and verified before reuse."""
